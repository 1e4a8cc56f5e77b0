from typing import Literal

HelpersResultPartStatus = Literal["error", "limit", "ok", "suspended"]

HELPERS_RESULT_PART_STATUS_VALUES: set[HelpersResultPartStatus] = {
    "error",
    "limit",
    "ok",
    "suspended",
}


def check_helpers_result_part_status(value: str) -> HelpersResultPartStatus:
    if value in HELPERS_RESULT_PART_STATUS_VALUES:
        return value
    raise TypeError(
        f"Unexpected value {value!r}. Expected one of {HELPERS_RESULT_PART_STATUS_VALUES!r}"
    )
