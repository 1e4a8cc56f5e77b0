from typing import Literal

CustomToolOutRuns = Literal["caller", "sandbox", "service"]

CUSTOM_TOOL_OUT_RUNS_VALUES: set[CustomToolOutRuns] = {
    "caller",
    "sandbox",
    "service",
}


def check_custom_tool_out_runs(value: str) -> CustomToolOutRuns:
    if value in CUSTOM_TOOL_OUT_RUNS_VALUES:
        return value
    raise TypeError(
        f"Unexpected value {value!r}. Expected one of {CUSTOM_TOOL_OUT_RUNS_VALUES!r}"
    )
