"""Request and response bodies of the conversations API."""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from app.events.webhooks import URL_MAX_CHARS, check_webhook_url
from app.helpers.base import Usage
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
        strict=True,
        description="Answer `text/event-stream`: the turn's events as they happen, ending with its end "
        "event. The turn keeps running if the client goes away.",
    )
    background: bool = Field(
        default=False,
        strict=True,
        description="Answer 202 with the queued Turn at once and run it on a job worker; poll "
        "`GET .../turns/{turn_id}` or follow `GET .../events`. With `stream`, the events are streamed.",
    )


def _json_integer(value: Any) -> Any:
    """A JSON integer: a number (``5`` or ``5.0``), not a string or a boolean that lax parsing would
    turn into one."""
    if isinstance(value, str | bool):
        raise ValueError("must be a JSON integer")
    return value


def _webhook_url_shape(value: str | None) -> str | None:
    return None if value is None else check_webhook_url(value)


WEBHOOK_URL_PATTERN = (
    r"^https?://[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*"
    r"(:[1-9][0-9]{0,3})?(/[A-Za-z0-9._~/-]*)?$"
)
"""What ``check_webhook_url`` accepts, as the schema says it (a subset: lower-case, no query)."""
# Checked with the body, before any state (If-Match, a running turn); keywords and helpers' names are
# checked by the service (422 invalid_tool).
TOOL_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
TOOL_NAME_DOC = "A Python identifier (ASCII), neither a keyword nor a built-in helper's name."
NON_BLANK: dict[str, Any] = {"pattern": r"\S"}
"""In the schema what ``_non_blank`` checks (its message stays the error): some non-space character."""


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
        number = isinstance(item, (int, float)) and not isinstance(item, bool)
        if number and not INT64_MIN <= item <= INT64_MAX:
            raise ValueError(f"{key!r}: numbers must be in the 64-bit integer range (-2**63 to 2**63 - 1)")
    return value


METADATA_SCHEMA: dict[str, Any] = {
    "propertyNames": {"maxLength": METADATA_KEY_CHARS},
    "additionalProperties": {
        "anyOf": [
            {"type": "string", "maxLength": METADATA_VALUE_CHARS},
            # JSON Schema cannot tell 1e19 from the integer 10**19: every number keeps to one range,
            # written with bounds a double holds exactly (2**63 - 1 is not one: it rounds to 2**63).
            {"type": "number", "minimum": INT64_MIN, "exclusiveMaximum": INT64_MAX + 1},
            {"type": "boolean"},
            {"type": "null"},
        ]
    },
}
"""In the schema what ``_bounded_metadata`` checks (its messages stay the errors)."""


class FunctionDefinition(BaseModel):
    """The ``function`` object of the Chat Completions tool shape."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=TOOL_NAME_PATTERN, description=TOOL_NAME_DOC)
    description: str = Field(default="", max_length=4_000)
    parameters: dict[str, Any] | None = None
    strict: bool | None = Field(default=None, strict=True)


class ResponsesTool(BaseModel):
    """An external tool in the OpenAI Responses shape: ``{type, name, description, parameters}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=TOOL_NAME_PATTERN, description=TOOL_NAME_DOC)
    description: str = Field(default="", max_length=4_000)
    parameters: dict[str, Any] | None = None
    strict: bool | None = Field(default=None, strict=True)

    def definition(self) -> FunctionDefinition:
        """The tool as one shape, whichever it came in."""
        return FunctionDefinition(name=self.name, description=self.description, parameters=self.parameters)


class ChatTool(BaseModel):
    """An external tool in the OpenAI Chat Completions shape: ``{type, function: {...}}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition

    def definition(self) -> FunctionDefinition:
        """The tool as one shape, whichever it came in."""
        return self.function


def _tool_shape(value: Any) -> str | None:
    if isinstance(value, dict):
        if ("function" in value) == ("name" in value):
            return None
        return "chat" if "function" in value else "responses"
    return "chat" if isinstance(value, ChatTool) else "responses"


ToolIn = Annotated[
    Annotated[ResponsesTool, Tag("responses")] | Annotated[ChatTool, Tag("chat")],
    Discriminator(
        _tool_shape,
        custom_error_type="tool_shape",
        custom_error_message="give either `name` (Responses shape) or `function` (Chat Completions shape)",
    ),
]
"""An external tool in either OpenAI function-tool shape."""


# A seeded history: at most this many messages (each also bounded, and the body as a whole).
MAX_HISTORY_MESSAGES = 1_000
MAX_TOOLS = 128
# A model name a request may name (a conversation's override, Chat Completions' backing model).
MAX_MODEL_CHARS = 200
"""External tools one request may declare, and a conversation hold (its messages may add some)."""
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class HistoryToolCall(_Request):
    """A tool call an assistant message of the history made."""

    id: str = Field(min_length=1, max_length=64, pattern=r"^[\x21-\x7e]+$")
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    arguments: dict[str, Any] = Field(default_factory=dict)


class HistoryUser(_Request):
    """A user message of the history."""

    role: Literal["user"]
    content: str = Field(min_length=1)


class HistoryAssistant(_Request):
    """An assistant message of the history: text, tool calls, or both."""

    role: Literal["assistant"]
    content: str | None = None
    tool_calls: list[HistoryToolCall] = Field(default_factory=list, max_length=128)

    @model_validator(mode="after")
    def _not_empty(self) -> HistoryAssistant:
        if not (self.content or "").strip() and not self.tool_calls:
            raise ValueError("an assistant message needs `content` or `tool_calls`")
        return self


class HistoryTool(_Request):
    """The result of one tool call of the previous assistant message: an ``output`` or an ``error``."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["output"], "not": {"required": ["error"]}},
                {"required": ["error"], "not": {"required": ["output"]}},
            ]
        }
    )

    role: Literal["tool"]
    tool_call_id: str = Field(min_length=1, max_length=64)
    output: Any = None
    error: str | None = Field(default=None, max_length=20_000)

    @model_validator(mode="before")
    @classmethod
    def _output_or_error(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("output" in data) == ("error" in data):
            raise ValueError("give exactly one of `output` or `error`")
        return data


HistoryMessage = Annotated[HistoryUser | HistoryAssistant | HistoryTool, Field(discriminator="role")]


class CreateConversation(TurnRequest):
    """Start a conversation and run its first turn."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "input": "What is the status of order A1?",
                    "persona": "default",
                    "tools": [
                        {
                            "type": "function",
                            "name": "get_order",
                            "description": "Look up an order.",
                            "parameters": {
                                "type": "object",
                                "properties": {"order_id": {"type": "string"}},
                                "required": ["order_id"],
                            },
                        }
                    ],
                    "metadata": {"customer": "c_42"},
                }
            ]
        }
    )

    input: str | None = Field(
        default=None,
        json_schema_extra=NON_BLANK,
        description="The user's message. Required unless `messages` is given: without it, the model "
        "continues from the history, which then ends with a user or `tool` message.",
    )
    messages: list[HistoryMessage] = Field(
        default_factory=list,
        max_length=MAX_HISTORY_MESSAGES,
        description="A dialogue the conversation starts from, before `input`: user and assistant "
        "messages, an assistant's `tool_calls` and a `tool` message answering each, right after it. "
        "Stored as the start of the transcript; the model sees the calls as a block and its results.",
    )
    persona: str = Field(default="default", max_length=64, description="Persona name.")
    instructions: str | None = Field(
        default=None,
        max_length=20_000,
        description="Extra system instructions for this conversation.",
    )
    model: str | None = Field(default=None, max_length=MAX_MODEL_CHARS, description="Override the model.")
    metadata: dict[str, MetadataValue] = Field(
        default_factory=dict,
        max_length=64,
        json_schema_extra=METADATA_SCHEMA,
        description=(
            f"Free-form labels, returned as given: keys up to {METADATA_KEY_CHARS} characters, strings "
            f"up to {METADATA_VALUE_CHARS}, numbers in the 64-bit integer range."
        ),
    )
    max_iterations: int | None = Field(
        default=None, ge=1, le=100, description="Model calls per turn before it fails."
    )
    tools: list[ToolIn] = Field(
        default_factory=list,
        max_length=MAX_TOOLS,
        description="External tools the caller runs: calling one pauses the turn with pending_tool_calls.",
    )
    webhook_url: str | None = Field(
        default=None,
        max_length=URL_MAX_CHARS,
        json_schema_extra={"format": "uri", "pattern": WEBHOOK_URL_PATTERN},
        description="POST the end of every turn here (turn.completed, turn.awaiting_tool_results, "
        "turn.failed, turn.cancelled), signed the Standard Webhooks way with the tenant's secret; "
        "unset: the tenant's default, if any. An http or https URL without credentials; a private or "
        "loopback address is refused at delivery unless the server allows it.",
    )

    _max_iterations = field_validator("max_iterations", mode="before")(_json_integer)
    _metadata = field_validator("metadata", mode="before")(_bounded_metadata)
    _webhook_url = field_validator("webhook_url")(_webhook_url_shape)

    @field_validator("input")
    @classmethod
    def _input_not_blank(cls, value: str | None) -> str | None:
        return None if value is None else _non_blank(value)

    @model_validator(mode="after")
    def _something_to_answer(self) -> CreateConversation:
        if self.input is None and (not self.messages or self.messages[-1].role == "assistant"):
            raise ValueError(
                "give `input`, or `messages` that end with a user or tool message for the model to answer"
            )
        return self


class PostMessage(TurnRequest):
    """The next user message."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"input": "And order B2?"}]})

    input: str = Field(description="The user's message.", json_schema_extra=NON_BLANK)
    tools: list[ToolIn] | None = Field(
        default=None,
        max_length=MAX_TOOLS,
        description="Add or replace external tools (by name) from this message on.",
    )

    _input = field_validator("input")(_non_blank)


class ToolOutput(BaseModel):
    """The caller's answer to one pending call: its ``output`` (any JSON, ``null`` included)."""

    model_config = ConfigDict(extra="forbid")

    tool_call_id: str = Field(min_length=1, max_length=64)
    output: Any = Field(description="What the call returns to the code (any JSON).")

    @property
    def error(self) -> None:
        """No error: this result is an output."""
        return None


class ToolError(BaseModel):
    """The caller's answer to one pending call: it failed with this ``error`` message (raised in the code)."""

    model_config = ConfigDict(extra="forbid")

    tool_call_id: str = Field(min_length=1, max_length=64)
    error: str = Field(max_length=20_000)

    @property
    def output(self) -> None:
        """No output: this result is an error."""
        return None


def _result_shape(value: Any) -> str | None:
    if isinstance(value, dict):
        if ("output" in value) == ("error" in value):
            return None
        return "error" if "error" in value else "output"
    return "error" if isinstance(value, ToolError) else "output"


ToolResultIn = Annotated[
    Annotated[ToolOutput, Tag("output")] | Annotated[ToolError, Tag("error")],
    Discriminator(
        _result_shape,
        custom_error_type="tool_result_shape",
        custom_error_message="give exactly one of `output` or `error`",
    ),
]
"""One result: exactly one of ``output`` or ``error``."""


class ToolResults(TurnRequest):
    """Results for the pending tool calls, exactly one per pending call."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "results": [
                        {"tool_call_id": "call_1", "output": {"status": "shipped"}},
                        {"tool_call_id": "call_2", "error": "order B2 not found"},
                    ]
                }
            ]
        }
    )

    results: list[ToolResultIn] = Field(min_length=1, max_length=128)


class _Out(BaseModel):
    # Fields with defaults are always sent: required in the response schema (no "unset" in SDKs).
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


class TurnErrorBody(_Out):
    code: str = Field(
        description=(
            "Stable: `llm_unavailable`, `llm_rate_limited`, `llm_bad_response`, `llm_bad_request` (the model "
            "server), `max_iterations_reached`, `turn_not_stored`, `turn_superseded`, `runner_lost`, "
            "`internal_error`. A string, not an enum: a later version may add codes."
        )
    )
    message: str
    retryable: bool


class PendingToolCall(_Out):
    id: str
    name: str
    arguments: dict[str, Any]
    code: str | None = None
    expires_at: datetime | None = None


TurnStatus = Literal["queued", "running", "completed", "awaiting_tool_results", "failed", "cancelled"]


class TurnOut(_Out):
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


class TurnList(_Out):
    """Turns of a conversation, newest first."""

    data: list[TurnOut]
    has_more: bool
    next_before: str | None = Field(description="Pass as `before` to get the next (older) page.")


ConversationStatus = Literal["idle", "running", "awaiting_tool_results"]


class ConversationOut(_Out):
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


class ConversationList(_Out):
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

    @field_validator("created_at")
    @classmethod
    def _in_utc(cls, value: datetime) -> datetime:
        # The store compares in UTC: a time at the calendar's edge with an offset (year 1 at +01:00)
        # has no UTC value, and converting it later in the query was a 500.
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError("the time has no UTC value") from None

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

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"metadata": {"tier": "gold", "obsolete": None}}]}
    )

    metadata: dict[str, MetadataValue] = Field(
        max_length=METADATA_MAX_KEYS,
        json_schema_extra=METADATA_SCHEMA,
        description=(
            "Merged into the stored metadata: a key with a value sets it (same limits as at creation), a "
            f"key with `null` removes it, keys not named are kept. At most {METADATA_MAX_KEYS} keys "
            "may remain. The conversation's version does not change."
        ),
    )

    _metadata = field_validator("metadata", mode="before")(_bounded_metadata)


class MessageOut(_Out):
    id: str
    seq: int
    turn_id: str
    role: Literal["user", "assistant"]
    parts: list[Part]
    created_at: datetime


class MessageList(_Out):
    data: list[MessageOut]
    has_more: bool
    next_after: int | None = Field(description="Pass as `after` to get the next page.")
