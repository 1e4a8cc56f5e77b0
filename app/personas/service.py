"""Persona rules outside the file format: where personas are loaded from, and how they are shown."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from app.config import Settings
from app.helpers import HELPERS
from app.personas import schemas
from app.personas.cache import IdentityCache
from app.personas.loader import SHIPPED_DIR, PersonaError, PersonaProblem, load_personas
from app.personas.models import CustomTool, Persona
from app.personas.prompt import build_prompt, featured
from app.personas.tokens import count_tokens, tokenizer_name
from app.personas.tooldoc import signature

_TOKENS: IdentityCache[int] = IdentityCache()


def persona_directories(settings: Settings) -> tuple[Path, ...]:
    """The shipped directory, then the user directory when it exists (or was set explicitly: a
    ``SABRE_PERSONAS_DIR`` that does not exist is an error, not a silent fallback)."""
    user = settings.personas_dir
    if "personas_dir" in settings.model_fields_set or user.is_dir():
        return SHIPPED_DIR, user
    return (SHIPPED_DIR,)


def load_configured_personas(settings: Settings) -> dict[str, Persona]:
    """Every persona the service offers; ``PersonaError`` (start-up fails) lists every problem."""
    directories = persona_directories(settings)
    if len(directories) > 1 and not directories[1].is_dir():
        raise PersonaError(
            [PersonaProblem(file=directories[1], message="SABRE_PERSONAS_DIR is not a directory")]
        )
    return dict(_load_unchanged(directories, _fingerprint(directories)))


def _fingerprint(directories: tuple[Path, ...]) -> tuple[tuple[str, int, int], ...]:
    """Names, times and sizes of the persona files: a new fingerprint means a new load."""
    files = (path for directory in directories for path in sorted(directory.glob("*.y*ml")))
    return tuple((str(path), path.stat().st_mtime_ns, path.stat().st_size) for path in files)


@functools.lru_cache(maxsize=8)
def _load_unchanged(
    directories: tuple[Path, ...], fingerprint: tuple[tuple[str, int, int], ...]
) -> dict[str, Persona]:
    """Checking the personas costs ~0.6 s (YAML with line numbers, schema checks): do it once per
    set of unchanged files per process (each app built in one process, e.g. in tests, reuses it)."""
    return load_personas(*directories)


def prompt_tokens(persona: Persona) -> int:
    """Tokens of the persona's system prompt as a conversation without request tools sees it."""
    key = (tuple(HELPERS.items()), tokenizer_name())
    return _TOKENS.get(persona, key, lambda: count_tokens(build_prompt(persona)))


def _tool(tool: CustomTool) -> schemas.CustomToolOut:
    ref = tool.ref
    return schemas.CustomToolOut(
        name=tool.name,
        description=tool.description,
        execution_mode=tool.execution_mode,
        implementation=ref.kind if ref else None,
        parameters=tool.parameters,
        returns=(
            schemas.ToolReturnsOut(type=tool.returns.type, description=tool.returns.description)
            if tool.returns
            else None
        ),
        signature=signature(tool.name, tool.parameters, returns=tool.returns.type if tool.returns else None),
    )


def summary(persona: Persona) -> schemas.PersonaSummary:
    """The list view of a persona."""
    return schemas.PersonaSummary(
        name=persona.name,
        description=persona.description,
        featured_helpers=list(persona.featured_helpers),
        documented_helpers=[spec.name for spec in featured(persona)],
        custom_tools=[_tool(t) for t in persona.custom_tools],
        model=persona.model,
        prompt_tokens=prompt_tokens(persona),
        tokenizer=tokenizer_name(),
    )


def detail(persona: Persona) -> schemas.PersonaDetail:
    """The full view of a persona."""
    limits = persona.limits
    network = persona.network
    return schemas.PersonaDetail(
        **summary(persona).model_dump(),
        identity=persona.identity,
        examples=list(persona.examples),
        limits=schemas.PersonaLimits(**limits.model_dump()) if limits else None,
        network=(
            schemas.PersonaNetwork(allow=list(network.allow), deny=list(network.deny)) if network else None
        ),
    )


def list_personas(personas: Mapping[str, Persona]) -> schemas.PersonaList:
    """Every persona, by name."""
    return schemas.PersonaList(data=[summary(personas[name]) for name in sorted(personas)])
