from typing import Literal

EventOutType = Literal[
    "block.completed",
    "block.started",
    "helper.completed",
    "helper.started",
    "llm.completed",
    "llm.delta",
    "llm.started",
    "tool_calls.pending",
    "tool_results.received",
    "turn.awaiting_tool_results",
    "turn.cancelled",
    "turn.completed",
    "turn.failed",
    "turn.started",
]

EVENT_OUT_TYPE_VALUES: set[EventOutType] = {
    "block.completed",
    "block.started",
    "helper.completed",
    "helper.started",
    "llm.completed",
    "llm.delta",
    "llm.started",
    "tool_calls.pending",
    "tool_results.received",
    "turn.awaiting_tool_results",
    "turn.cancelled",
    "turn.completed",
    "turn.failed",
    "turn.started",
}


def check_event_out_type(value: str) -> EventOutType:
    if value in EVENT_OUT_TYPE_VALUES:
        return value
    raise TypeError(
        f"Unexpected value {value!r}. Expected one of {EVENT_OUT_TYPE_VALUES!r}"
    )
