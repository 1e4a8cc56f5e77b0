"""app/tools/mcp_stdio.py on its own: lines split across and within chunks, the cap on a line, and the
transport's read stream for lines that parse, do not parse, or are too long (no MCP session)."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import time

import anyio
import mcp_types
import pytest
from anyio.abc import ByteReceiveStream
from mcp.client.stdio import StdioServerParameters
from mcp.shared.message import SessionMessage

from app.tools.mcp_stdio import LineTooLong, _Lines, stdio_client


class Chunks(ByteReceiveStream):
    """A byte stream that yields the given chunks, then ends."""

    def __init__(self, *chunks: bytes) -> None:
        self._chunks = list(chunks)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._chunks:
            raise anyio.EndOfStream
        return self._chunks.pop(0)

    async def aclose(self) -> None:
        self._chunks.clear()


async def read_all(lines: _Lines) -> list[bytes]:
    found = []
    while True:
        try:
            found.append(await lines.next())
        except anyio.EndOfStream:
            return found


async def test_lines_across_and_within_chunks() -> None:
    stream = Chunks(b"a", b"bc\nd\n\ne", b"f", b"\r\n", b"unfinished")
    assert await read_all(_Lines(stream, limit=10)) == [b"abc", b"d", b"", b"ef\r"]


async def test_a_line_of_the_limit_passes_and_one_byte_more_does_not() -> None:
    assert await read_all(_Lines(Chunks(b"12345", b"\n"), limit=5)) == [b"12345"]
    # Held without a newline: refused once it is past the limit, without waiting for more.
    lines = _Lines(Chunks(b"ok\n", b"123", b"456", b"never read"), limit=5)
    assert await lines.next() == b"ok"
    with pytest.raises(LineTooLong, match="more than 5 bytes"):
        await lines.next()
    # Whole in one chunk, or ended by the chunk after: refused too.
    for chunks in ([b"123456\nx\n"], [b"1234", b"56\n"]):
        with pytest.raises(LineTooLong):
            await _Lines(Chunks(*chunks), limit=5).next()


SERVER = textwrap.dedent(
    """
    import os, sys, time
    out = sys.stdout.buffer
    out.write(b'{"jsonrpc": "2.0", "method": "pid", "params": {"pid": %d}}\\n' % os.getpid())
    out.write(b"not json\\n")
    out.write(b"z" * 5000)
    out.flush()
    time.sleep(60)
    """
)


async def test_the_read_stream_parses_lines_and_ends_at_a_line_too_long() -> None:
    server = StdioServerParameters(command=sys.executable, args=["-c", SERVER])
    started = time.monotonic()
    async with stdio_client(server, max_line_bytes=1000) as (read_stream, _):
        first = await read_stream.receive()
        assert isinstance(first, SessionMessage)
        assert isinstance(first.message, mcp_types.JSONRPCNotification)
        assert first.message.params is not None
        pid = first.message.params["pid"]
        # A line that does not parse is an exception on the stream, as with the SDK's transport.
        second = await read_stream.receive()
        assert isinstance(second, ValueError)
        assert not isinstance(second, LineTooLong)
        too_long = await read_stream.receive()
        assert isinstance(too_long, LineTooLong)
        assert str(too_long).startswith("it wrote a line of more than 1,000 bytes to stdout")
        with pytest.raises(anyio.EndOfStream):
            await read_stream.receive()
        # The transport stopped the server itself, before its context was left.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the server still runs")
    assert time.monotonic() - started < 10
