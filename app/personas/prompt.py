"""The prompt builder: the one place that assembles what the model is told.

Layers: identity (persona), execution flow and meta patterns (constant templates), persona examples,
featured helpers' full docs, then the pointer to ``helpers()``. The output depends only on its
inputs, byte for byte, so providers' prompt caches keep hitting.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from app.helpers import HELPERS, HelperSpec
from app.personas.models import Persona


@cache
def _template(name: str) -> str:
    return files("app.personas").joinpath("templates", name).read_text(encoding="utf-8").strip()


def featured(persona: Persona) -> list[HelperSpec]:
    """The helpers a persona documents in full, in a stable order."""
    if "*" in persona.featured_helpers:
        return [HELPERS[name] for name in sorted(HELPERS)]
    return [HELPERS[name] for name in persona.featured_helpers if name in HELPERS]


def build_prompt(persona: Persona, *, instructions: str | None = None) -> str:
    """The system prompt for one conversation (``instructions`` are the caller's additions)."""
    sections = [
        persona.identity.strip(),
        _template("execution_flow.md"),
        _template("meta_patterns.md"),
    ]
    if persona.examples:
        examples = "\n\n".join(
            f"### Example {i}\n\n{example.strip()}" for i, example in enumerate(persona.examples, 1)
        )
        sections.append(f"## Example Workflows\n\n{examples}")
    docs = "\n".join(spec.render() for spec in featured(persona))
    sections.append(f"## Featured Helpers\n\n{docs.strip()}")
    sections.append(_template("helpers_pointer.md"))
    if instructions and instructions.strip():
        sections.append(f"## Instructions for this conversation\n\n{instructions.strip()}")
    return "\n\n".join(sections) + "\n"
