from typing import Literal

ConversationOutStatus = Literal["awaiting_tool_results", "idle", "running"]

CONVERSATION_OUT_STATUS_VALUES: set[ConversationOutStatus] = {
    "awaiting_tool_results",
    "idle",
    "running",
}


def check_conversation_out_status(value: str) -> ConversationOutStatus:
    if value in CONVERSATION_OUT_STATUS_VALUES:
        return value
    raise TypeError(
        f"Unexpected value {value!r}. Expected one of {CONVERSATION_OUT_STATUS_VALUES!r}"
    )
