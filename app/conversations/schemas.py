"""Request and response bodies of the conversations API."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from app.events.webhooks import URL_MAX_CHARS, check_webhook_url
from app.kit.json_body import INT64_MAX, INT64_MIN
from app.orchestrator.messages import Part

MetadataValue = str | int | float | bool | None
METADATA_KEY_CHARS = 64
METADATA_VALUE_CHARS = 512


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnRequest(_Request):
    """How the caller takes the turn a POST starts: waited for (default), streamed, or detached."""

    stream: bool = Field(
        default=False,
        description="Answer `text/event-stream`: the turn's events as they happen, ending with its end "
        "event. The turn keeps running if the client goes away.",
    )
    background: bool = Field(
        default=False,
        description="Answer 202 with the queued Turn at once and run it on a job worker; poll "
        "`GET .../turns/{turn_id}` or follow `GET .../events`. With `stream`, the events are streamed.",
    )


def _webhook_url_shape(value: str | None) -> str | None:
    return None if value is None else check_webhook_url(value)


def _non_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or whitespace")
    return value


def _bounded_metadata(value: Any) -> Any:
    """Metadata keys and strings of bounded length, integers in 64 bits (checked before pydantic,
    which would otherwise turn an integer too large for ``int`` into a float)."""
    if not isinstance(value, dict):
        return value
    for key, item in value.items():
        if isinstance(key, str) and len(key) > METADATA_KEY_CHARS:
            raise ValueError(f"key {key[:20]!r}…: keys are at most {METADATA_KEY_CHARS} characters")
        if isinstance(item, str) and len(item) > METADATA_VALUE_CHARS:
            raise ValueError(f"{key!r}: string values are at most {METADATA_VALUE_CHARS} characters")
        if isinstance(item, int) and not isinstance(item, bool) and not INT64_MIN <= item <= INT64_MAX:
            raise ValueError(f"{key!r}: integers must fit in 64 bits (-2**63 to 2**63 - 1)")
    return value


class FunctionDefinition(BaseModel):
    """The ``function`` object of the Chat Completions tool shape."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    description: str = Field(default="", max_length=4_000)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolIn(BaseModel):
    """An external tool in the OpenAI function-tool format, either shape:
    ``{type, name, description, parameters}`` (Responses) or ``{type, function: {...}}`` (Chat)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str | None = Field(default=None, min_length=1, max_length=64)
    description: str | None = Field(default=None, max_length=4_000)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    function: FunctionDefinition | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> ToolIn:
        if (self.function is None) == (self.name is None):
            raise ValueError("give either `name` (Responses shape) or `function` (Chat Completions shape)")
        if self.function is not None and (self.description is not None or self.parameters is not None):
            raise ValueError("with `function`, put description and parameters inside it")
        return self

    def definition(self) -> FunctionDefinition:
        """The tool as one shape, whichever it came in."""
        if self.function is not None:
            return self.function
        assert self.name is not None
        return FunctionDefinition(
            name=self.name, description=self.description or "", parameters=self.parameters
        )


class CreateConversation(TurnRequest):
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
        default_factory=dict,
        max_length=64,
        description=(
            f"Free-form labels, returned as given: keys up to {METADATA_KEY_CHARS} characters, strings "
            f"up to {METADATA_VALUE_CHARS}, integers in 64 bits."
        ),
    )
    max_iterations: int | None = Field(
        default=None, ge=1, le=100, description="Model calls per turn before it fails."
    )
    tools: list[ToolIn] = Field(
        default_factory=list,
        max_length=128,
        description="External tools the caller runs: calling one pauses the turn with pending_tool_calls.",
    )
    webhook_url: str | None = Field(
        default=None,
        max_length=URL_MAX_CHARS,
        description="POST the end of every turn here (turn.completed, turn.awaiting_tool_results, "
        "turn.failed, turn.cancelled), signed the Standard Webhooks way with the tenant's secret; "
        "unset: the tenant's default, if any. An http or https URL without credentials; a private or "
        "loopback address is refused at delivery unless the server allows it.",
    )

    _input = field_validator("input")(_non_blank)
    _metadata = field_validator("metadata", mode="before")(_bounded_metadata)
    _webhook_url = field_validator("webhook_url")(_webhook_url_shape)


class PostMessage(TurnRequest):
    """The next user message."""

    input: str
    tools: list[ToolIn] | None = Field(
        default=None,
        max_length=128,
        description="Add or replace external tools (by name) from this message on.",
    )

    _input = field_validator("input")(_non_blank)


class ToolResultIn(BaseModel):
    """The caller's answer to one pending call: an ``output`` (any JSON) or an ``error`` message."""

    model_config = ConfigDict(extra="forbid")

    tool_call_id: str = Field(min_length=1, max_length=64)
    output: Any = None
    error: str | None = Field(default=None, max_length=20_000)

    @model_validator(mode="before")
    @classmethod
    def _output_or_error(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("output" in data) == ("error" in data):
            raise ValueError("give exactly one of `output` or `error`")
        return data


class ToolResults(TurnRequest):
    """Results for the pending tool calls, exactly one per pending call."""

    results: list[ToolResultIn] = Field(min_length=1, max_length=128)


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


TurnStatus = Literal["queued", "running", "completed", "awaiting_tool_results", "failed", "cancelled"]


class TurnOut(BaseModel):
    """The result of one turn."""

    conversation_id: str
    turn_id: str
    status: TurnStatus
    output: str | None
    pending_tool_calls: list[PendingToolCall] = Field(default_factory=list)
    error: TurnErrorBody | None = None
    usage: Usage
    version: int = Field(description="The conversation's version after the turn (before it, while it runs).")
    warnings: list[str] = Field(default_factory=list)
    background: bool = False
    cancel_requested: bool = False
    created_at: datetime | None = None
    finished_at: datetime | None = None


class TurnList(BaseModel):
    """Turns of a conversation, newest first."""

    data: list[TurnOut]
    has_more: bool
    next_before: str | None = Field(description="Pass as `before` to get the next (older) page.")


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


class ConversationList(BaseModel):
    """One page of the tenant's conversations, newest first."""

    data: list[ConversationOut]
    has_more: bool
    next_after: str | None = Field(
        description="Pass as `after` to get the next (older) page; an opaque cursor, null on the last page."
    )


class ConversationCursor(BaseModel):
    """Where a page of conversations ended: the last one's ``(created_at, id)``, the listing's sort key.

    A position, not an offset, so conversations created between two pages (which sort before the
    cursor) neither shift nor repeat what comes after it. Sent to clients as base64url JSON, which
    they pass back unread; ``v`` lets a later format refuse this one instead of misreading it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    created_at: AwareDatetime
    id: str = Field(min_length=1, max_length=64)

    def encode(self) -> str:
        """The opaque text a client passes back as ``after``."""
        return base64.urlsafe_b64encode(self.model_dump_json().encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> ConversationCursor:
        """The cursor ``encode`` made; ``ValueError`` for anything else."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError) as exc:
            raise ValueError("not base64url") from exc
        return cls.model_validate_json(raw)  # a ValidationError is a ValueError


METADATA_MAX_KEYS = 64


class PatchConversation(_Request):
    """Change a conversation's metadata, as a JSON merge patch (RFC 7396) of the stored object."""

    metadata: dict[str, MetadataValue] = Field(
        max_length=METADATA_MAX_KEYS,
        description=(
            "Merged into the stored metadata: a key with a value sets it (same limits as at creation), a "
            f"key with `null` removes it, keys not named are kept. At most {METADATA_MAX_KEYS} keys "
            "may remain. The conversation's version does not change."
        ),
    )

    _metadata = field_validator("metadata", mode="before")(_bounded_metadata)


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
