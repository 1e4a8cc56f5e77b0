"""Turn events as the API shows them: one JSON shape for the page, the SSE stream and webhooks."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, Field

EventType = Literal[
    "turn.started",
    "llm.started",
    "llm.delta",
    "llm.completed",
    "block.started",
    "block.completed",
    "helper.started",
    "helper.completed",
    "tool_calls.pending",
    "tool_results.received",
    "turn.completed",
    "turn.awaiting_tool_results",
    "turn.failed",
    "turn.cancelled",
]

# The events that end a turn; their data is the Turn object.
END_TYPES: Final[frozenset[str]] = frozenset(
    {"turn.completed", "turn.awaiting_tool_results", "turn.failed", "turn.cancelled"}
)


class EventOut(BaseModel):
    """One event of a turn. ``seq`` orders a conversation's events without gaps; ``parent_id`` is the
    event that opened the node this one belongs to (the turn, an LLM call, a block, a helper)."""

    id: str
    seq: int
    turn_id: str
    parent_id: str | None
    type: EventType
    created_at: datetime
    data: dict[str, Any]


class EventList(BaseModel):
    data: list[EventOut]
    has_more: bool
    next_after: int | None = Field(description="Pass as `after` to get the next page.")
