from typing import Literal

CustomToolOutExecutionMode = Literal["external", "internal"]

CUSTOM_TOOL_OUT_EXECUTION_MODE_VALUES: set[CustomToolOutExecutionMode] = {
    "external",
    "internal",
}


def check_custom_tool_out_execution_mode(value: str) -> CustomToolOutExecutionMode:
    if value in CUSTOM_TOOL_OUT_EXECUTION_MODE_VALUES:
        return value
    raise TypeError(
        f"Unexpected value {value!r}. Expected one of {CUSTOM_TOOL_OUT_EXECUTION_MODE_VALUES!r}"
    )
