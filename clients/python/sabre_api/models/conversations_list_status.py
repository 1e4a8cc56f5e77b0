from typing import Literal

ConversationsListStatus = Literal["awaiting_tool_results", "idle", "running"]

CONVERSATIONS_LIST_STATUS_VALUES: set[ConversationsListStatus] = {
    "awaiting_tool_results",
    "idle",
    "running",
}


def check_conversations_list_status(value: str) -> ConversationsListStatus:
    if value in CONVERSATIONS_LIST_STATUS_VALUES:
        return value
    raise TypeError(
        f"Unexpected value {value!r}. Expected one of {CONVERSATIONS_LIST_STATUS_VALUES!r}"
    )
