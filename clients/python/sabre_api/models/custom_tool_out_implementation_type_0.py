from typing import Literal

CustomToolOutImplementationType0 = Literal["mcp", "python"]

CUSTOM_TOOL_OUT_IMPLEMENTATION_TYPE_0_VALUES: set[CustomToolOutImplementationType0] = {
    "mcp",
    "python",
}


def check_custom_tool_out_implementation_type_0(
    value: str,
) -> CustomToolOutImplementationType0:
    if value in CUSTOM_TOOL_OUT_IMPLEMENTATION_TYPE_0_VALUES:
        return value
    raise TypeError(
        f"Unexpected value {value!r}. Expected one of {CUSTOM_TOOL_OUT_IMPLEMENTATION_TYPE_0_VALUES!r}"
    )
