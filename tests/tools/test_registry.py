"""Who runs a tool follows from what it has, in the one word set of ``Runner``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from app.orchestrator.paused import PausedBlock
from app.runtime.schemas import SandboxTool
from app.tools.registry import ToolDefinitionError, ToolRegistry, make_tool


async def _handler(arguments: Mapping[str, Any]) -> Any:
    return dict(arguments)


_SOURCE = SandboxTool(
    name="score", params=(), file="tools/score.py", function="score", source="def score(): ..."
)


def test_a_tool_is_run_by_the_service_the_sandbox_or_the_caller() -> None:
    registry = ToolRegistry(
        [
            make_tool(name="query", description="", parameters=None, handler=_handler),
            make_tool(name="score", description="", parameters=None, sandbox=_SOURCE),
            make_tool(name="refund", description="", parameters=None),
        ]
    )
    assert [(t.name, t.runs) for t in registry] == [
        ("query", "service"),
        ("score", "sandbox"),
        ("refund", "caller"),
    ]
    assert [t.name for t in registry.run_by("service")] == ["query"]
    assert [t.name for t in registry.run_by("caller")] == ["refund"]
    assert registry.sandbox_tools() == [_SOURCE]


def test_a_tool_cannot_be_run_by_both_the_service_and_the_sandbox() -> None:
    with pytest.raises(ToolDefinitionError, match="not both"):
        make_tool(name="both", description="", parameters=None, handler=_handler, sandbox=_SOURCE)


def test_a_turn_paused_before_the_one_vocabulary_still_resumes() -> None:
    """Pause records stored with the old words (``kind: external``) load as ``runs: caller``."""
    call = {"name": "refund", "args": [], "kwargs": {}, "arguments": {}, "line": 1, "code": "refund()"}
    stored = {
        "version": 1,
        "code": "refund()",
        "pending": [
            {"id": "call_1", "call": {**call, "kind": "external"}, "expires_at": "2030-01-01T00:00:00Z"},
            {"id": "call_2", "call": {**call, "kind": "internal"}, "expires_at": "2030-01-01T00:00:00Z"},
        ],
    }
    paused = PausedBlock.from_store(stored)
    assert [p.call.runs for p in paused.pending] == ["caller", "service"]
    assert paused.to_store()["pending"][0]["call"]["runs"] == "caller"
    assert "kind" not in paused.to_store()["pending"][0]["call"]
    unknown = {**stored["pending"][0], "call": {**call, "kind": "x"}}
    with pytest.raises(ValueError, match="runs"):
        PausedBlock.from_store({**stored, "pending": [unknown]})
