from typing import Literal

ChoiceFinishReason = Literal["stop", "tool_calls"]

CHOICE_FINISH_REASON_VALUES: set[ChoiceFinishReason] = {
    "stop",
    "tool_calls",
}


def check_choice_finish_reason(value: str) -> ChoiceFinishReason:
    if value in CHOICE_FINISH_REASON_VALUES:
        return value
    raise TypeError(
        f"Unexpected value {value!r}. Expected one of {CHOICE_FINISH_REASON_VALUES!r}"
    )
