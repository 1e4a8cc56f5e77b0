"""Response bodies of the personas API."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from app.runtime.schemas import Runner


class ToolReturnsOut(BaseModel):
    type: str = Field(description="Python annotation of the return value, as the prompt shows it.")
    description: str


class CustomToolOut(BaseModel):
    """A persona's custom tool: how it is called and who runs it."""

    name: str
    description: str
    execution_mode: Literal["internal", "external"] = Field(
        description="As the persona file says it: `internal` (SABRE runs it, see `runs`) or `external`."
    )
    runs: Runner = Field(
        description=(
            "Who runs it: `sandbox` (a Python function, next to the model's code), `service` (an MCP "
            "server's tool, called by the service) or `caller` (the turn pauses for the caller to run it)."
        )
    )
    implementation: Literal["python", "mcp"] | None = Field(
        description="How an internal tool is implemented (a Python function or an MCP server's tool)."
    )
    parameters: dict[str, Any] = Field(description="JSON Schema of the arguments.")
    returns: ToolReturnsOut | None
    signature: str = Field(description="The Python signature the model sees.")


class PersonaLimits(BaseModel):
    """Per-block sandbox limits; `null` means the service's default (`SABRE_BLOCK_<NAME>`)."""

    cpu_seconds: float | None
    memory_mb: int | None
    wall_clock_seconds: float | None
    stdout_bytes: int | None
    max_processes: int | None
    file_size_mb: int | None
    open_files: int | None
    snapshot_bytes: int | None
    disk_mb: int | None
    disk_files: int | None


class PersonaNetwork(BaseModel):
    """Hosts the persona's network helpers may or may not reach."""

    allow: list[str]
    deny: list[str]


class PersonaSummary(BaseModel):
    """What a client needs to choose a persona."""

    name: str
    description: str
    featured_helpers: list[str] = Field(description="As declared; `*` features every helper.")
    documented_helpers: list[str] = Field(description="Helpers whose full docs are in the prompt.")
    custom_tools: list[CustomToolOut]
    model: str | None = Field(description="The model this persona asks for, if any.")
    prompt_tokens: int = Field(
        description="Size of the persona's rendered system prompt (no request tools or instructions)."
    )
    tokenizer: str = Field(
        description="What counted `prompt_tokens`: `cl100k_base`, or `estimate:chars/4` when unavailable."
    )


class PersonaDetail(PersonaSummary):
    """A persona in full: its identity, examples and limits too."""

    identity: str
    examples: list[str]
    limits: PersonaLimits | None
    network: PersonaNetwork | None


class PersonaList(BaseModel):
    data: list[PersonaSummary]
