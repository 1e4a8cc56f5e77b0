"""The persona file format (YAML), validated strictly so a broken persona fails at start-up."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Persona(BaseModel):
    """An agent identity: who it is, how it works (examples) and which helpers it features."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    description: str = ""
    identity: str = Field(min_length=1)
    examples: list[str] = Field(default_factory=list)
    featured_helpers: list[str] = Field(default_factory=lambda: ["*"])
    model: str | None = None
