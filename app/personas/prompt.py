"""The prompt builder: the one place that assembles what the model is told.

Three layers (seed 002): the execution flow and the meta patterns (constant templates), then the
persona: identity, example workflows, the full docs of its featured helpers and of the tools of the
conversation (its custom tools and the caller's), then the pointer to ``helpers()`` for everything
else. The output depends only on its inputs, byte for byte, so providers' prompt caches keep
hitting; the persona part is computed once per persona because this runs on every turn.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Protocol

from app.helpers import HELPERS, HelperSpec
from app.personas.cache import IdentityCache
from app.personas.models import Persona
from app.personas.tooldoc import FunctionToolDoc

__all__ = ["FunctionToolDoc", "ToolDoc", "build_prompt", "featured", "render_prompt"]

_REQUIRES = re.compile(r"^\[\[([A-Za-z_][\w.]*)\]\]")


class ToolDoc(Protocol):
    """A tool the prompt documents: its name (to resolve clashes) and its rendered documentation
    (a Python signature and a description). External tools of a conversation are passed this way."""

    @property
    def name(self) -> str: ...

    def render(self) -> str: ...


@cache
def _template(name: str) -> str:
    return files("app.personas").joinpath("templates", name).read_text(encoding="utf-8").strip()


def _conditional(text: str, helpers: Mapping[str, HelperSpec]) -> str:
    """Keep ``[[helper]]``-prefixed lines only when that helper exists; drop headings left empty.

    The meta patterns name helpers by name, and telling the model about a helper it does not have
    would make it call a NameError.
    """
    paragraphs = []
    for paragraph in text.split("\n\n"):
        lines = paragraph.split("\n")
        kept = []
        conditional = False
        for line in lines:
            match = _REQUIRES.match(line)
            if match is None:
                kept.append(line)
                continue
            conditional = True
            if match[1] in helpers:
                kept.append(line[match.end() :])
        if conditional and all(line.startswith("**") for line in kept):
            continue
        paragraphs.append("\n".join(kept))
    return "\n\n".join(paragraphs)


def featured(persona: Persona, *, helpers: Mapping[str, HelperSpec] = HELPERS) -> list[HelperSpec]:
    """The helpers a persona documents in full, in a stable order (``*``: all, sorted by name).

    Names that are not helpers (the persona's custom tools, helpers not available yet) are skipped.
    """
    if "*" in persona.featured_helpers:
        return [helpers[name] for name in sorted(helpers)]
    return [helpers[name] for name in persona.featured_helpers if name in helpers]


def _examples(persona: Persona) -> str | None:
    """The examples section; each example gets an ``### Example N`` heading unless it has one."""
    if not persona.examples:
        return None
    parts = []
    for i, example in enumerate(persona.examples, 1):
        text = example.strip()
        parts.append(text if text.startswith("#") else f"### Example {i}\n\n{text}")
    body = "\n\n".join(parts)
    if body.startswith("## "):
        return body
    return f"## Example Workflows\n\nHere is how you approach typical tasks:\n\n{body}"


@dataclass(frozen=True, slots=True)
class _Head:
    """What a persona contributes to every prompt, rendered once."""

    text: str  # identity, flow, meta patterns, examples, featured helpers
    tool_docs: tuple[tuple[str, str], ...]  # (name, rendered docs) of its custom tools
    tools_body: str  # the same docs joined, for the common case where no caller tool clashes


def _head(persona: Persona, helpers: Mapping[str, HelperSpec]) -> _Head:
    sections = [
        persona.identity.strip(),
        _template("execution_flow.md"),
        _conditional(_template("meta_patterns.md"), helpers),
    ]
    examples = _examples(persona)
    if examples:
        sections.append(examples)
    docs = "\n".join(spec.render() for spec in featured(persona, helpers=helpers)).strip()
    if docs:
        sections.append(f"## Featured Helpers\n\n{docs}")
    tool_docs = tuple((tool.name, tool.render().strip()) for tool in persona.custom_tools)
    return _Head(
        text="\n\n".join(sections),
        tool_docs=tool_docs,
        tools_body="\n\n".join(doc for _, doc in tool_docs),
    )


_HEADS: IdentityCache[_Head] = IdentityCache()
_TOOLS_INTRO = (
    "These functions are in your namespace: call them from `<helpers>` blocks with keyword "
    "arguments and use their return values like any Python value. Some run in the caller's "
    "systems: the block then waits for their result, which your code does not notice; make "
    "independent calls together with `parallel(...)` so that they cost one wait."
)


def _tools_section(head: _Head, tools: Sequence[ToolDoc]) -> str | None:
    """Docs of the conversation's tools: the persona's, then the caller's; the caller's tool wins a
    name clash (it is the one the runtime registers)."""
    passed: dict[str, ToolDoc] = {}
    for tool in tools:
        passed.setdefault(tool.name, tool)
    if any(name in passed for name, _ in head.tool_docs):
        own = [doc for name, doc in head.tool_docs if name not in passed]
    else:
        own = [head.tools_body] if head.tools_body else []
    docs = own + [tool.render().strip() for tool in passed.values()]
    if not docs:
        return None
    return "## Tools\n\n" + _TOOLS_INTRO + "\n\n" + "\n\n".join(docs)


def render_prompt(
    persona: Persona,
    *,
    helpers: Mapping[str, HelperSpec],
    instructions: str | None = None,
    tools: Sequence[ToolDoc] = (),
) -> str:
    """``build_prompt`` against an explicit helper registry (tests, benchmarks)."""
    key = tuple(helpers.items())  # a few hundred ns; catches a registry that changed since
    head = _HEADS.get(persona, key, lambda: _head(persona, helpers))
    sections = [head.text]
    tool_docs = _tools_section(head, tools)
    if tool_docs:
        sections.append(tool_docs)
    sections.append(_template("helpers_pointer.md"))
    if instructions and instructions.strip():
        sections.append(f"## Instructions for this conversation\n\n{instructions.strip()}")
    return "\n\n".join(sections) + "\n"


def build_prompt(persona: Persona, *, instructions: str | None = None, tools: Sequence[ToolDoc] = ()) -> str:
    """The system prompt of one conversation: the persona's layers, then the docs of ``tools`` (the
    conversation's external tools), the ``helpers()`` pointer and the caller's ``instructions``."""
    return render_prompt(persona, helpers=HELPERS, instructions=instructions, tools=tools)
