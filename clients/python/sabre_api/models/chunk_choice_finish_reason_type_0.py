from typing import Literal

ChunkChoiceFinishReasonType0 = Literal["stop", "tool_calls"]

CHUNK_CHOICE_FINISH_REASON_TYPE_0_VALUES: set[ChunkChoiceFinishReasonType0] = {
    "stop",
    "tool_calls",
}


def check_chunk_choice_finish_reason_type_0(value: str) -> ChunkChoiceFinishReasonType0:
    if value in CHUNK_CHOICE_FINISH_REASON_TYPE_0_VALUES:
        return value
    raise TypeError(
        f"Unexpected value {value!r}. Expected one of {CHUNK_CHOICE_FINISH_REASON_TYPE_0_VALUES!r}"
    )
