from typing import Literal

TurnOutStatus = Literal[
    "awaiting_tool_results", "cancelled", "completed", "failed", "queued", "running"
]

TURN_OUT_STATUS_VALUES: set[TurnOutStatus] = {
    "awaiting_tool_results",
    "cancelled",
    "completed",
    "failed",
    "queued",
    "running",
}


def check_turn_out_status(value: str) -> TurnOutStatus:
    if value in TURN_OUT_STATUS_VALUES:
        return value
    raise TypeError(
        f"Unexpected value {value!r}. Expected one of {TURN_OUT_STATUS_VALUES!r}"
    )
