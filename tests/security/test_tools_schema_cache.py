"""The compiled-schema cache is bounded by the bytes of the schemas it keeps, not by their count:
a caller's schema may be as large as a request body (long descriptions or enums of few subschemas),
and two thousand such entries would hold gigabytes of the server every tenant shares."""

from __future__ import annotations

from typing import Any

from app.tools import schema as schema_module
from app.tools.schema import SCHEMA_CACHE_BYTES, SCHEMA_CACHE_ENTRY_BYTES, compile_schema


def _wide(tag: int, size: int) -> dict[str, Any]:
    """A valid schema of three subschemas whose text is about ``size`` bytes."""
    return {
        "type": "object",
        "description": f"{tag}:" + "x" * size,
        "properties": {"a": {"type": "string"}},
    }


def test_large_schemas_never_hold_more_than_the_byte_bound() -> None:
    for tag in range(2 * SCHEMA_CACHE_BYTES // (SCHEMA_CACHE_ENTRY_BYTES // 2)):
        validator = compile_schema(_wide(tag, SCHEMA_CACHE_ENTRY_BYTES // 2))
        assert validator.is_valid({"a": "yes"})
        assert not validator.is_valid({"a": 1})
    assert schema_module._COMPILED.currsize <= SCHEMA_CACHE_BYTES
    assert len(schema_module._COMPILED) < 2 * SCHEMA_CACHE_BYTES // (SCHEMA_CACHE_ENTRY_BYTES // 2)


def test_a_schema_over_the_entry_bound_is_checked_but_not_kept() -> None:
    huge = _wide(-1, SCHEMA_CACHE_ENTRY_BYTES + 10)
    first, second = compile_schema(huge), compile_schema(huge)
    assert first is not second  # compiled again: nothing of it was kept
    assert first.is_valid({"a": "yes"})
    assert not second.is_valid({"a": 1})


def test_the_same_small_schema_is_compiled_once() -> None:
    small = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}
    assert compile_schema(small) is compile_schema(dict(small))
