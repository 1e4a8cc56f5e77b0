"""The stdio transport of our MCP sessions: the SDK's ``stdio_client``, with a bound on a line.

Why it exists: the SDK's reader (``mcp.client.stdio``, SDK 2.3) joins the text it holds to every chunk it
reads and splits the whole again, so a line costs time quadratic in its length on the event loop (a 20 MB
line: 3 s of the loop's CPU; 40 MB: 12.5 s), and nothing bounds a line: a server that writes without a
newline keeps the loop busy and its buffer growing long after the call timed out. One event loop serves
every tenant, so one broken or hostile server stalled every request.

Here lines are split in time linear in their length, and one may hold at most ``MAX_LINE_BYTES``. Past
that the transport stops reading the server, stops it (its process group: SIGTERM, then SIGKILL), puts
``LineTooLong`` on the read stream and closes it, so the session's pending and later requests fail at once
with "Connection closed"; app/tools/mcp_client.py tells the caller why. The rest is the SDK's: its
parameters and default environment, message types and their validation, its process-group kill, and the
same shutdown (close stdin, wait, then terminate the group). POSIX only, as the service is.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import TextIO

import anyio
import mcp_types
import structlog
from anyio.abc import ByteReceiveStream, Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

log = structlog.get_logger(__name__)

# The longest line (one JSON-RPC message, without its newline) a server may write. Far above any sensible
# tool result, and half of what all the answers of one block may weigh (app.runtime.protocol's
# MAX_JOURNAL_BYTES, 32 MiB); the reader holds at most this plus one chunk (64 KiB) per server.
MAX_LINE_BYTES = 16 * 1024 * 1024
# The longest stderr line of a server logged (the rest of a longer one is dropped).
STDERR_LINE_CHARS = 4096

# As the SDK: time for a server to exit once its stdin is closed, then from SIGTERM to SIGKILL of its
# process group, then for the loop to see it dead; and for the writer to send what it already accepted.
_EXIT_GRACE = 2.0
_KILL_GRACE = 2.0
_REAP_GRACE = 2.0
_FLUSH_GRACE = 0.5
_POLL_SECONDS = 0.01

ReadStream = MemoryObjectReceiveStream[SessionMessage | Exception]
WriteStream = MemoryObjectSendStream[SessionMessage]


class LineTooLong(Exception):
    """The server wrote a line longer than the limit: the transport stopped the server and ended."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"it wrote a line of more than {_size(limit)} to stdout (the limit of one message), "
            "so it was stopped"
        )
        self.limit = limit


@asynccontextmanager
async def stdio_client(
    server: StdioServerParameters,
    *,
    name: str = "",
    errlog: TextIO | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> AsyncIterator[tuple[ReadStream, WriteStream]]:
    """Start ``server`` and yield the session's streams, as ``mcp.client.stdio.stdio_client`` does.

    The server runs in a session (process group) of its own, with the SDK's default environment plus
    ``server.env``, in ``server.cwd``, its stderr going to ``errlog`` or, by default, into our log: each
    line an ``mcp_server_stderr`` event naming the server (``name``). Each line it writes to stdout
    becomes a ``SessionMessage``, or the parse error as an exception; one over ``max_line_bytes``
    becomes ``LineTooLong`` and ends the stream. Leaving the context stops the server (bounded: a few
    seconds at most, even when cancelled).
    """
    process = await anyio.open_process(
        [server.command, *server.args],
        env=get_default_environment() | (server.env or {}),
        cwd=server.cwd,
        # Never our stderr itself: a server's lines (what it was asked, chosen by a tenant's model)
        # would stand in our JSON log as lines of our own.
        stderr=errlog if errlog is not None else subprocess.PIPE,
        start_new_session=True,
    )
    # No await from here to the task group, or a cancellation in between would leak the process.
    assert process.stdin is not None
    assert process.stdout is not None
    stdin, stdout = process.stdin, process.stdout
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    def decode(line: bytes) -> SessionMessage | Exception:
        try:
            text = line.decode(server.encoding, errors=server.encoding_error_handler)
            return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False))
        except ValueError as exc:  # pydantic's ValidationError and UnicodeDecodeError are ValueErrors
            log.warning("mcp_stdio_bad_line", pid=process.pid, length=len(line), error=str(exc)[:300])
            return exc

    async def read() -> None:
        lines = _Lines(stdout, limit=max_line_bytes)
        async with to_session:
            try:
                while True:
                    await to_session.send(decode(await lines.next()))
            except LineTooLong as exc:
                log.warning("mcp_stdio_line_too_long", pid=process.pid, limit=max_line_bytes)
                # The session learns why and ends while the server is being stopped, not after.
                async with anyio.create_task_group() as stopping:
                    stopping.start_soon(_kill, process)
                    with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                        await to_session.send(exc)
                    to_session.close()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the session is gone (shutdown closed its end)
            except (anyio.EndOfStream, OSError):
                return  # the server closed its stdout (or exited): the session sees its stream end
        # Nobody wants what the server still writes; drop it, up to one more line's worth: a server blocked
        # writing could not exit, and the last bytes of a dead one would keep its pipe (and with it
        # asyncio's subprocess transport) open. Past that, the kill deals with the server.
        await _discard(stdout, max_line_bytes)

    async def write() -> None:
        try:
            async with from_session:
                async for message in from_session:
                    json = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send(
                        f"{json}\n".encode(server.encoding, errors=server.encoding_error_handler)
                    )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server no longer reads: end the session rather than leave its requests waiting.
            await to_session.aclose()
        finally:
            writer_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        tg.start_soon(write)
        if process.stderr is not None:
            tg.start_soon(_relay_stderr, process.stderr, name, process.pid)
        try:
            yield read_stream, write_stream
        finally:
            # Shielded, and every wait in it bounded: a cancelled caller must not leave the server running.
            with anyio.CancelScope(shield=True):
                read_stream.close()  # the reader now discards what the server still writes
                write_stream.close()  # the writer sends what it accepted, then ends
                with anyio.move_on_after(_FLUSH_GRACE):
                    await writer_done.wait()
                await _stop(process)
            tg.cancel_scope.cancel()


class _Lines:
    """The lines of a byte stream, without their newline, found in time linear in their length.

    Each chunk is searched once (from where the last search stopped) and appended to one ``bytearray``;
    a line longer than ``limit`` raises ``LineTooLong`` as soon as that many bytes are held.
    """

    def __init__(self, stream: ByteReceiveStream, *, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self._buffer = bytearray()
        self._searched = 0

    async def next(self) -> bytes:
        """The next line; ``anyio.EndOfStream`` at the end (an unfinished last line is dropped)."""
        while True:
            end = self._buffer.find(b"\n", self._searched)
            length = end if end >= 0 else len(self._buffer)
            if length > self._limit:
                raise LineTooLong(self._limit)
            if end >= 0:
                line = bytes(self._buffer[:end])
                # Amortised linear: a bytearray drops its head by moving its start, copying the rest only
                # when it shrinks below half its allocation.
                del self._buffer[: end + 1]
                self._searched = 0
                return line
            self._searched = len(self._buffer)
            self._buffer += await self._stream.receive()


async def _relay_stderr(stream: ByteReceiveStream, name: str, pid: int) -> None:
    """Log each line the server writes to stderr as an ``mcp_server_stderr`` event, its text a
    field (so it cannot pass for a line of ours) cut at ``STDERR_LINE_CHARS``, until the stream ends."""
    pending = bytearray()
    dropped = False  # the rest of a line already cut

    def emit(raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace")
        log.info("mcp_server_stderr", server=name, pid=pid, line=text[:STDERR_LINE_CHARS])

    with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        while True:
            pending += await stream.receive()
            while (end := pending.find(b"\n")) >= 0:
                if not dropped:
                    emit(bytes(pending[:end]))
                dropped = False
                del pending[: end + 1]
            if len(pending) > STDERR_LINE_CHARS:
                if not dropped:
                    emit(bytes(pending))
                dropped = True
                pending.clear()
    if pending and not dropped:
        emit(bytes(pending))


async def _discard(stream: ByteReceiveStream, budget: int) -> None:
    """Read and drop up to ``budget`` bytes of ``stream``, until its end or its closing."""
    with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        while budget > 0:
            budget -= len(await stream.receive())


async def _kill(process: Process) -> None:
    """Terminate the server's process group now (shielded, and bounded: SIGKILL follows a grace)."""
    with anyio.CancelScope(shield=True):
        await terminate_posix_process_tree(process, _KILL_GRACE)


async def _stop(process: Process) -> None:
    """Close the server's stdin and give it time to exit, then terminate its process group."""
    assert process.stdin is not None
    assert process.stdout is not None
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, within=_EXIT_GRACE):
        await terminate_posix_process_tree(process, _KILL_GRACE)
        if not await _exited(process, within=_REAP_GRACE):
            log.warning("mcp_stdio_server_survived_kill", pid=process.pid)
    # A process that survived, or a child it left holding stdout, must not keep the reader waiting.
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()
    if process.stderr is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stderr.aclose()


async def _exited(process: Process, *, within: float) -> bool:
    """Whether ``process`` exits within ``within`` seconds (polled: ``wait()`` also waits for its pipes
    to close, which a child holding them can put off for ever)."""
    with anyio.move_on_after(within):
        while process.returncode is None:  # noqa: ASYNC110 (nothing to wait on but the poll)
            await anyio.sleep(_POLL_SECONDS)
    return process.returncode is not None


def _size(limit: int) -> str:
    mib = 1024 * 1024
    return f"{limit // mib} MiB" if limit % mib == 0 else f"{limit:,} bytes"
