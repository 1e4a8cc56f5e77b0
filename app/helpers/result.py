"""``result(value)``: the value a block hands back; shown to the model in ``<helpers_result>``."""

from __future__ import annotations

from app.helpers.base import HelperSpec

SPEC = HelperSpec(
    name="result",
    signature="result(value: Any) -> None",
    doc="""
Return a value from the block: it is shown to you in <helpers_result> (strings as they are,
other values as their repr). Call it several times to return several values.
Example:
    total = sum(prices)
    result(f"total: {total}")
""",
    runs="sandbox",
)
