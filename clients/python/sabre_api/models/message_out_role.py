from typing import Literal

MessageOutRole = Literal["assistant", "user"]

MESSAGE_OUT_ROLE_VALUES: set[MessageOutRole] = {
    "assistant",
    "user",
}


def check_message_out_role(value: str) -> MessageOutRole:
    if value in MESSAGE_OUT_ROLE_VALUES:
        return value
    raise TypeError(
        f"Unexpected value {value!r}. Expected one of {MESSAGE_OUT_ROLE_VALUES!r}"
    )
