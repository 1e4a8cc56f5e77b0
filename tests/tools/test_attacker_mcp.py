"""MCP servers that misbehave (tests/tools/hostile_mcp_server.py, raw JSON-RPC over stdio): each call
ends with a value or a ``HelperError`` in bounded time, and the next call still works."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.tools.mcp import McpManager, StdioServerConfig

HOSTILE_SERVER = Path(__file__).with_name("hostile_mcp_server.py")


@pytest.fixture
async def hostile() -> AsyncIterator[McpManager]:
    config = StdioServerConfig(transport="stdio", command=sys.executable, args=(str(HOSTILE_SERVER),))
    manager = McpManager({"h": config}, timeout=3)
    try:
        yield manager
    finally:
        await manager.aclose()


async def test_bytes_that_are_not_utf8_do_not_wedge_the_session(hostile: McpManager) -> None:
    # Before: the SDK's stdout reader died on the first such byte (strict decoding) while the session
    # still looked alive, so every later call to the server timed out until the service restarted.
    assert await hostile.call_tool("h", "bad_utf8", {}) == "a\ufffd\ufffdb"
    started = time.monotonic()
    assert await hostile.call_tool("h", "ok", {}) == "fine"
    assert time.monotonic() - started < 2


async def test_a_flood_of_notifications_before_the_answer(hostile: McpManager) -> None:
    assert await hostile.call_tool("h", "flood", {"n": 5000}) == "after the flood"
    assert await hostile.call_tool("h", "ok", {}) == "fine"
