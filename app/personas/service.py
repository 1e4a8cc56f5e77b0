"""Persona rules outside the file format: where personas are loaded from, and how they are shown."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import structlog

from app.config import Settings
from app.helpers import HELPERS
from app.personas import schemas
from app.personas.cache import IdentityCache
from app.personas.loader import SHIPPED_DIR, PersonaError, PersonaProblem, load_personas
from app.personas.models import CustomTool, Persona, PythonRef
from app.personas.prompt import build_prompt, featured
from app.personas.tokens import count_tokens, tokenizer_name
from app.personas.tooldoc import signature
from app.runtime.schemas import SandboxTool

log = structlog.get_logger(__name__)
_TOKENS: IdentityCache[int] = IdentityCache()
# The largest implementation file a persona tool may have: its source travels with every block.
MAX_TOOL_SOURCE_BYTES = 512 * 1024


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


def sandbox_tool(tool: CustomTool, ref: PythonRef) -> SandboxTool:
    """A persona's ``file.py::function`` tool as the sandbox runs it, with the file's current
    source (re-read when the file changes, so an author's edit takes effect on the next turn).

    The loader checked the file at start-up; if it cannot be read now, the tool still exists and
    raises, saying why, where the code calls it: the turn goes on and the model is told.
    """
    path = Path(ref.path)
    try:
        stat = path.stat()
        source = _read_source(str(path), stat.st_mtime_ns, stat.st_size)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning("persona_tool_unreadable", tool=tool.name, file=str(path), error=str(exc))
        why = f"the implementation of {tool.name} cannot be read: {exc}"
        source = f"def {ref.function}(**_):\n    raise RuntimeError({why!r})\n"
    params = tuple(tool.parameters.get("properties", {}))
    return SandboxTool(name=tool.name, params=params, file=str(path), function=ref.function, source=source)


@functools.lru_cache(maxsize=256)
def _read_source(path: str, mtime_ns: int, size: int) -> str:
    """The text of an implementation file, once per version of it (the key holds its stat)."""
    if size > MAX_TOOL_SOURCE_BYTES:
        raise ValueError(f"{size} bytes; an implementation file may have {MAX_TOOL_SOURCE_BYTES}")
    with open(path, encoding="utf-8") as file:
        return file.read(MAX_TOOL_SOURCE_BYTES + 1)


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
        runs=tool.runs,
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
