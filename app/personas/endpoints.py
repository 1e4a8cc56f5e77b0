"""HTTP face of personas: list them, show one (global, but behind the same API key as the rest)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Request
from fastapi.concurrency import run_in_threadpool

from app.auth.dependencies import Tenant
from app.kit.errors import NotFound
from app.kit.openapi import problem_responses
from app.kit.routing import api_router
from app.personas import schemas, service
from app.personas.models import Persona

PersonaName = Annotated[str, Path(max_length=64, description="A persona name, e.g. `coder`.")]

router = api_router(prefix="/v1/personas", tags=["personas"])


def _personas(request: Request) -> dict[str, Persona]:
    personas: dict[str, Persona] = request.app.state.personas
    return personas


@router.get("", response_model=schemas.PersonaList)
async def list_personas(request: Request, tenant: Tenant) -> schemas.PersonaList:
    """Every persona: description, featured helpers, custom tools and prompt size."""
    # The first call loads the tokenizer (a fraction of a second): keep it off the event loop.
    return await run_in_threadpool(service.list_personas, _personas(request))


@router.get("/{name}", response_model=schemas.PersonaDetail, responses=problem_responses(404))
async def get_persona(name: PersonaName, request: Request, tenant: Tenant) -> schemas.PersonaDetail:
    """One persona in full: identity, examples, featured helpers, custom tools with their schemas."""
    personas = _personas(request)
    persona = personas.get(name)
    if persona is None:
        raise NotFound(f"No persona {name!r}; available: {', '.join(sorted(personas))}.")
    return await run_in_threadpool(service.detail, persona)
