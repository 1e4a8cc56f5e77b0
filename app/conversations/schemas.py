"""Request and response bodies of the conversations API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.orchestrator.messages import Part

MetadataValue = str | int | float | bool | None


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _non_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or whitespace")
    return value


class CreateConversation(_Request):
    """Start a conversation and run its first turn."""

    input: str = Field(description="The user's first message.")
    persona: str = Field(default="default", max_length=64, description="Persona name.")
    instructions: str | None = Field(
        default=None,
        max_length=20_000,
        description="Extra system instructions for this conversation.",
    )
    model: str | None = Field(default=None, max_length=200, description="Override the model.")
    metadata: dict[str, MetadataValue] = Field(
        default_factory=dict, max_length=64, description="Free-form labels, returned as given."
    )
    max_iterations: int | None = Field(
        default=None, ge=1, le=100, description="Model calls per turn before it fails."
    )

    _input = field_validator("input")(_non_blank)


class PostMessage(_Request):
    """The next user message."""

    input: str

    _input = field_validator("input")(_non_blank)


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0
    iterations: int = 0


class TurnErrorBody(BaseModel):
    code: str
    message: str
    retryable: bool


class PendingToolCall(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any]
    code: str | None = None
    expires_at: datetime | None = None


TurnStatus = Literal["completed", "awaiting_tool_results", "failed"]


class TurnOut(BaseModel):
    """The result of one turn."""

    conversation_id: str
    turn_id: str
    status: TurnStatus
    output: str | None
    pending_tool_calls: list[PendingToolCall] = Field(default_factory=list)
    error: TurnErrorBody | None = None
    usage: Usage
    version: int
    warnings: list[str] = Field(default_factory=list)


ConversationStatus = Literal["idle", "running", "awaiting_tool_results"]


class ConversationOut(BaseModel):
    """A conversation's state."""

    id: str
    persona: str
    model: str
    status: ConversationStatus
    version: int
    metadata: dict[str, MetadataValue]
    max_iterations: int
    pending_tool_calls: list[PendingToolCall] = Field(default_factory=list)
    usage: Usage
    created_at: datetime
    updated_at: datetime


class MessageOut(BaseModel):
    id: str
    seq: int
    turn_id: str
    role: Literal["user", "assistant"]
    parts: list[Part]
    created_at: datetime


class MessageList(BaseModel):
    data: list[MessageOut]
    has_more: bool
    next_after: int | None = Field(description="Pass as `after` to get the next page.")
