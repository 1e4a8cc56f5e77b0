"""MCP servers that misbehave (tests/tools/hostile_mcp_server.py, raw JSON-RPC over stdio): each call
ends with a value or a ``HelperError`` in bounded time, and the next call still works."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from app.helpers import HelperError
from app.tools.mcp import McpManager, StdioServerConfig
from app.tools.mcp_stdio import MAX_LINE_BYTES

HOSTILE_SERVER = Path(__file__).with_name("hostile_mcp_server.py")
# Far above what the calls below may take, so that failing fast and timing out cannot be confused.
PATIENT_TIMEOUT = 30.0


def hostile_manager(timeout: float) -> McpManager:
    config = StdioServerConfig(transport="stdio", command=sys.executable, args=(str(HOSTILE_SERVER),))
    return McpManager({"h": config}, timeout=timeout)


@pytest.fixture
async def hostile() -> AsyncIterator[McpManager]:
    manager = hostile_manager(3)
    try:
        yield manager
    finally:
        await manager.aclose()


@pytest.fixture
async def patient() -> AsyncIterator[McpManager]:
    manager = hostile_manager(PATIENT_TIMEOUT)
    try:
        yield manager
    finally:
        await manager.aclose()


class LoopWatch:
    """How late a task ticking every 10 ms was at worst, and the event loop's CPU time, while it ran."""

    late = 0.0
    cpu = 0.0


@asynccontextmanager
async def watching_the_loop() -> AsyncIterator[LoopWatch]:
    watch = LoopWatch()

    async def tick() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            watch.late = max(watch.late, time.monotonic() - before - 0.01)

    ticker = asyncio.create_task(tick())
    started = time.thread_time()  # this thread runs the loop
    try:
        yield watch
    finally:
        watch.cpu = time.thread_time() - started
        ticker.cancel()


async def gone(pid: int, *, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_bytes_that_are_not_utf8_do_not_wedge_the_session(hostile: McpManager) -> None:
    # Before: the SDK's stdout reader died on the first such byte (strict decoding) while the session
    # still looked alive, so every later call to the server timed out until the service restarted.
    assert await hostile.call_tool("h", "bad_utf8", {}) == "a\ufffd\ufffdb"
    started = time.monotonic()
    assert await hostile.call_tool("h", "ok", {}) == "fine"
    assert time.monotonic() - started < 2


async def test_a_flood_of_notifications_before_the_answer(patient: McpManager) -> None:
    # 5,000 notifications take 0.3 s here on a quiet machine (each is parsed and validated), but
    # more than 3 s with two test suites on two cores: the answer is the point, not the time.
    assert await patient.call_tool("h", "flood", {"n": 5000}) == "after the flood"
    assert await patient.call_tool("h", "ok", {}) == "fine"


async def test_a_line_that_is_not_json_rpc_costs_that_line_only(hostile: McpManager) -> None:
    # As with the SDK's transport: the line is an exception on the read stream, the session goes on.
    assert await hostile.call_tool("h", "garbage", {}) == "after the garbage"
    assert await hostile.call_tool("h", "ok", {}) == "fine"


@pytest.mark.parametrize(
    ("tool", "n"),
    [
        ("huge_text", MAX_LINE_BYTES + 1),  # a whole line, one byte of text over the cap
        ("endless_line", 20_000_000),  # 20 MB without a newline, then silence with stdout open
    ],
)
async def test_a_line_over_the_cap_stops_the_server_and_fails_the_call_at_once(
    patient: McpManager, tool: str, n: int
) -> None:
    # Before: the SDK's reader rebuilt its buffer for every chunk (20 MB: 3 s of the event loop's CPU,
    # 40 MB: 12.5 s) with no bound on a line; the whole line was returned, or the call waited out the
    # timeout while the server lived on.
    pid = int(await patient.call_tool("h", "pid", {}))
    started = time.monotonic()
    async with watching_the_loop() as watch:
        with pytest.raises(HelperError, match=r"more than 16 MiB .*the next call restarts it") as raised:
            await patient.call_tool("h", tool, {"n": n})
    assert time.monotonic() - started < PATIENT_TIMEOUT / 3, raised.value
    # Loose on a shared machine: the loop read 16 MiB in 64 KiB chunks, ~0.03 s of CPU when measured.
    assert watch.cpu < 1.0
    assert watch.late < 0.25
    assert await gone(pid, within=5), "the server still runs"
    # The next call starts the server again.
    assert int(await patient.call_tool("h", "pid", {})) != pid
    assert await patient.call_tool("h", "ok", {}) == "fine"


async def test_a_long_line_under_the_cap_is_read_whole_in_linear_time(patient: McpManager) -> None:
    # A line of ~15.8 MB: ~0.1 s of the loop's CPU when measured (reading, parsing, validating). The
    # bound is loose, against a quadratic reader coming back: the SDK's took 0.9 to 2 s on this line.
    n = MAX_LINE_BYTES - 1_000_000
    async with watching_the_loop() as watch:
        assert await patient.call_tool("h", "huge_text", {"n": n}) == "x" * n
    assert watch.cpu < 1.0
    assert await patient.call_tool("h", "ok", {}) == "fine"
