"""Transcript messages: parts discriminated on ``kind``, stored and served through one adapter."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

Role = Literal["user", "assistant"]


class _Part(BaseModel):
    # `kind` has a default but is always sent: required in the response schema, so generated
    # clients get a discriminated union.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


class TextPart(_Part):
    """Plain text: the user's input or the model's prose around a block."""

    kind: Literal["text"] = "text"
    text: str


class HelpersPart(_Part):
    """A ``<helpers>`` block the model wrote."""

    kind: Literal["helpers"] = "helpers"
    code: str
    closed: bool = True


class HelpersResultPart(_Part):
    """What running a block produced, exactly as the model was shown it."""

    kind: Literal["helpers_result"] = "helpers_result"
    status: Literal["ok", "error", "limit", "suspended"]
    text: str
    dropped: list[str] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list, description="Ids of the figures the block produced.")


# Set on the tool calls and results of a history a conversation was created with: the model sees
# them as a block and its result (the ones the code made reach it through the block itself).
_SEEDED = Field(
    default=False,
    exclude_if=lambda seeded: not seeded,
    description="From the history the conversation was created with (`messages`), not made by a block.",
)


class ToolCallPart(_Part):
    """An external tool call the code made; the turn paused on it."""

    kind: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    arguments: dict[str, Any]
    code: str | None = None
    seeded: bool = _SEEDED


class ToolResultPart(_Part):
    """The caller's answer to an external tool call."""

    kind: Literal["tool_result"] = "tool_result"
    tool_call_id: str
    output: Any = None
    error: str | None = None
    seeded: bool = _SEEDED


Part = Annotated[
    TextPart | HelpersPart | HelpersResultPart | ToolCallPart | ToolResultPart,
    Field(discriminator="kind"),
]
PARTS = TypeAdapter(list[Part])


class TranscriptMessage(BaseModel):
    """One message of the transcript as the turn loop builds it (before it gets an id)."""

    role: Role
    parts: list[Part]
    # PNG figures shown to the model with this message in the turn that made them (not stored here:
    # they are stored as files, and later turns see the text reference only).
    images: list[bytes] = Field(default_factory=list, exclude=True)

    def dump_parts(self) -> list[dict[str, Any]]:
        """The parts as JSON-ready dicts for the store."""
        dumped: list[dict[str, Any]] = PARTS.dump_python(self.parts, mode="json")
        return dumped


def load_parts(raw: list[Any]) -> list[Part]:
    """Parts read back from the store (validated, so a bad row fails loudly)."""
    return PARTS.validate_python(raw)
