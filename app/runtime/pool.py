"""RuntimePool: runs blocks in pre-forked sandbox children of long-lived warm workers.

The request path never spawns or forks: each worker has an idle child already waiting for its
block, so starting a block is one pipe write. After a block the worker forks the next child in
the background. A worker whose child ended abnormally (killed, sent garbage, timed out) is
recycled: killed and replaced in the background, so the framing can never get out of step.

Everything the parent reads from a worker is JSON (validated, size-capped); the snapshot blob is
carried opaque and never unpickled here.
"""

from __future__ import annotations

import asyncio
import contextlib
import keyword
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.runtime.protocol import (
    MAX_HEADER_BYTES,
    PREFIX,
    PROTOCOL_VERSION,
    FrameError,
    decode_header,
    decode_prefix,
    encode_frame,
    limit_label,
)
from app.runtime.schemas import BlockOutcome, CallReply, HelperCall, JournalEntry, Limits

logger = logging.getLogger(__name__)

_PROJECT_ROOT: Final = Path(__file__).resolve().parents[2]
# Names the runtime puts in every namespace; helpers and tools may not take them.
RESERVED_NAMES: Final = frozenset({"result", "ToolError", "print"})
# A child gets this long past its wall clock to stop itself (keeping its output) before the
# parent kills it.
_KILL_GRACE_SECONDS: Final = 0.5
_START_TIMEOUT_SECONDS: Final = 120.0  # a cold first import of numpy+pandas+matplotlib is slow
_REARM_TIMEOUT_SECONDS: Final = 30.0
_MAX_RESPAWN_DELAY: Final = 30.0

OnCall = Callable[[HelperCall], Awaitable[CallReply]]


def worker_env() -> dict[str, str]:
    """The whole environment of a worker and its children: built from scratch, no secrets.

    HOME is set per block (to its workdir); PYTHONHASHSEED is fixed so that set iteration
    order, and with it the order of calls, is the same when a block is replayed.
    """
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "MPLBACKEND": "Agg",
    }


# -- frames the parent accepts from a worker (validated: the child is hostile) --------------


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ReadyFrame(_Frame):
    t: Literal["ready"]
    pid: int = Field(gt=1)


class _ExitFrame(_Frame):
    t: Literal["exit"]
    pid: int
    code: int | None
    signal: int | None
    cpu_seconds: float


class _CallFrame(_Frame):
    t: Literal["call"]
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    call: HelperCall


class _DoneFrame(_Frame):
    t: Literal["done"]
    status: Literal["ok", "error", "limit", "suspended"]
    stdout: str
    results: list[str]
    error: str | None
    limit: str | None
    dropped: list[str]
    replayed: int = Field(ge=0)


class _BlockFailed(Exception):
    """The block ended without reporting (killed, timed out, garbage): the worker is recycled
    and the outcome built from this."""

    def __init__(self, status: Literal["error", "limit"], message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- one worker -----------------------------------------------------------------------------


class _Worker:
    """A worker process and the pid of its idle child."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.child_pid: int | None = None
        self.dead = False
        assert proc.stdin is not None
        assert proc.stdout is not None
        self._stdin = proc.stdin
        self._stdout = proc.stdout

    async def read(
        self, *, max_blob: int, max_header: int = MAX_HEADER_BYTES
    ) -> tuple[dict[str, Any], bytes]:
        """Read one frame; FrameError if it is malformed or too large."""
        try:
            prefix = await self._stdout.readexactly(PREFIX.size)
            header_len, blob_len = decode_prefix(prefix, max_header=max_header, max_blob=max_blob)
            data = await self._stdout.readexactly(header_len + blob_len)
        except asyncio.IncompleteReadError:
            raise FrameError("the sandbox worker closed its pipe (it died)") from None
        return decode_header(data[:header_len]), data[header_len:]

    async def send(self, data: bytes) -> None:
        """Write one frame; FrameError if the worker is gone."""
        try:
            self._stdin.write(data)
            await self._stdin.drain()
        except (ConnectionError, RuntimeError) as exc:  # RuntimeError: the transport is closed
            raise FrameError(f"the sandbox worker closed its pipe (it died): {exc}") from None

    def kill(self) -> None:
        """SIGKILL the child's process group (the code and what it started) and the worker."""
        self.dead = True
        if self.proc.returncode is not None:
            return  # reaped already: its pid (and the child's, gone with it) may be reused
        for pgid in (self.child_pid, self.proc.pid):
            if pgid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)

    async def await_ready(self) -> None:
        header, _ = await self.read(max_blob=0)
        self.child_pid = _ReadyFrame.model_validate(header).pid


def _exit_failure(frame: _ExitFrame, limits: Limits) -> _BlockFailed:
    """Map how a child died (before reporting) to the block's limit or error."""
    if frame.signal == signal.SIGXCPU or (
        frame.signal == signal.SIGKILL and frame.cpu_seconds >= limits.cpu_seconds
    ):
        # SIGKILL past the CPU limit is RLIMIT_CPU's hard limit (the code ignored SIGXCPU).
        return _BlockFailed("limit", limit_label("cpu_time", limits.model_dump()))
    if frame.signal == signal.SIGXFSZ:
        return _BlockFailed("limit", limit_label("file_size", limits.model_dump()))
    if frame.signal is not None:
        name = signal.Signals(frame.signal).name if frame.signal in signal.valid_signals() else ""
        hint = " (possibly out of memory)" if frame.signal == signal.SIGKILL else ""
        return _BlockFailed(
            "error", f"SandboxError: the block's process was killed by {name or frame.signal}{hint}"
        )
    return _BlockFailed(
        "error", f"SandboxError: the block's process exited with code {frame.code} before it finished"
    )


class RuntimePool:
    """A pool of warm sandbox workers; ``run_block`` runs one block in a fresh fork."""

    def __init__(self, *, size: int = 2, preload: Sequence[str] = ("numpy", "pandas", "matplotlib")) -> None:
        if size < 1:
            raise ValueError("a runtime pool needs at least one worker")
        self._size = size
        self._preload = tuple(preload)
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._workers: set[_Worker] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._spawn_error: str | None = None  # why the last replacement failed to start

    @property
    def idle_workers(self) -> int:
        """Workers whose child is forked and waiting for a block (for readiness and metrics)."""
        return self._idle.qsize()

    # Lifespan ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the workers and wait until each has an idle child."""
        results = await asyncio.gather(*(self._spawn() for _ in range(self._size)), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.aclose()
            raise RuntimeError(f"sandbox worker failed to start: {failures[0]}") from failures[0]
        for worker in results:
            assert isinstance(worker, _Worker)
            self._idle.put_nowait(worker)

    async def aclose(self) -> None:
        """Kill every worker (and child); blocks still running end with an error."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        workers = list(self._workers)
        for worker in workers:
            worker.kill()
        await asyncio.gather(*(w.proc.wait() for w in workers), return_exceptions=True)
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        self._workers.clear()

    async def __aenter__(self) -> RuntimePool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _background(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _spawn(self) -> _Worker:
        """Start one worker process and wait for its first idle child."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app.runtime.worker",
            "--preload",
            ",".join(self._preload),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=worker_env(),
            cwd=_PROJECT_ROOT,
            start_new_session=True,  # its own process group, killed as one
            limit=1 << 20,
        )
        worker = _Worker(proc)
        self._workers.add(worker)
        self._background(self._watch(worker))
        try:
            async with asyncio.timeout(_START_TIMEOUT_SECONDS):
                await worker.await_ready()
        except BaseException:
            worker.kill()
            raise
        return worker

    async def _watch(self, worker: _Worker) -> None:
        """When a worker exits, for whatever reason, start a replacement."""
        await worker.proc.wait()
        worker.dead = True
        self._workers.discard(worker)
        if not self._closed:
            self._background(self._replace())

    async def _replace(self) -> None:
        delay = 0.5
        while not self._closed:
            try:
                worker = await self._spawn()
            except Exception as exc:
                self._spawn_error = str(exc) or type(exc).__name__
                logger.exception("sandbox worker failed to start; retrying in %.1fs", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_RESPAWN_DELAY)
            else:
                self._spawn_error = None
                self._idle.put_nowait(worker)
                return

    async def _rearm(self, worker: _Worker, child_pid: int | None) -> None:
        """After a block: see its child exit cleanly and the next child get ready."""
        try:
            async with asyncio.timeout(_REARM_TIMEOUT_SECONDS):
                header, _ = await worker.read(max_blob=0)
                ended = _ExitFrame.model_validate(header)
                if ended.pid != child_pid or ended.code != 0:
                    raise FrameError(f"the block's process ended oddly: {header}")
                await worker.await_ready()
        except (FrameError, ValidationError, TimeoutError) as exc:
            logger.warning("recycling sandbox worker %s: %s", worker.proc.pid, exc)
            worker.kill()
            return
        if not self._closed:
            self._idle.put_nowait(worker)

    # Running a block -----------------------------------------------------------------------

    async def run_block(
        self,
        *,
        code: str,
        snapshot: bytes | None,
        workdir: Path,
        limits: Limits,
        internal_helpers: Sequence[str],
        external_tools: Mapping[str, Sequence[str]],
        journal: Sequence[JournalEntry],
        on_call: OnCall,
    ) -> BlockOutcome:
        """Run one block in a fresh sandbox child and return how it ended.

        ``journal`` entries are replayed (inside the child, without calling ``on_call``)
        before any call reaches ``on_call``. ``limits.wall_clock_seconds`` counts the child's
        own time: it stops while ``on_call`` runs. An exception from ``on_call`` (or
        cancellation) kills the block and propagates.
        """
        if self._closed:
            raise RuntimeError("the runtime pool is closed")
        _check_names(internal_helpers, external_tools)
        if not workdir.is_absolute():
            raise ValueError(f"workdir must be an absolute path, not {workdir}")
        request = encode_frame(
            {
                "t": "run",
                "v": PROTOCOL_VERSION,
                "code": code,
                "workdir": str(workdir),
                "limits": dict(limits),  # flat model: same as model_dump(), a tenth of the cost
                "helpers": list(internal_helpers),
                "tools": {name: list(params) for name, params in external_tools.items()},
                "journal": [_wire_entry(e) for e in journal],
            },
            snapshot or b"",
        )
        worker = await self._acquire()
        started = time.perf_counter()
        exchange = _Exchange(
            worker=worker,
            limits=limits,
            names={
                **dict.fromkeys(internal_helpers, "internal"),
                **dict.fromkeys(external_tools, "external"),
            },
            journal=journal,
            on_call=on_call,
        )
        try:
            outcome = await exchange.run(request)
        except _BlockFailed as failed:
            worker.kill()
            return BlockOutcome(
                status=failed.status,
                stdout="",
                results=[],
                error=failed.message if failed.status == "error" else None,
                limit=failed.message if failed.status == "limit" else None,
                snapshot=None,
                dropped=[],
                journal=exchange.journal,
                pending=None,
                duration_ms=(time.perf_counter() - started) * 1e3,
            )
        except BaseException:
            worker.kill()
            raise
        outcome.duration_ms = (time.perf_counter() - started) * 1e3
        self._background(self._rearm(worker, worker.child_pid))
        return outcome

    async def _acquire(self) -> _Worker:
        """An idle worker, waiting for one if all are busy; dead ones are skipped.

        Fails rather than wait forever when the pool is closed, or has no worker left and
        cannot start one.
        """
        while True:
            if self._idle.empty():
                if self._closed:
                    raise RuntimeError("the runtime pool is closed")
                if not self._workers and self._spawn_error is not None:
                    raise RuntimeError(f"no sandbox worker can start: {self._spawn_error}")
                try:
                    async with asyncio.timeout(1.0):  # then look at the two conditions again
                        worker = await self._idle.get()
                except TimeoutError:
                    continue
            else:
                worker = self._idle.get_nowait()
            if not worker.dead and worker.proc.returncode is None:
                return worker


def _wire_entry(entry: JournalEntry) -> list[Any]:
    """A journal entry as the child reads it: [name, digest, value] or, for an error,
    [name, digest, null, error_type, error_message] (compact: a resume may carry hundreds)."""
    if entry.error_type is None and entry.error_message is None:
        return [entry.name, entry.digest, entry.value]
    return [entry.name, entry.digest, None, entry.error_type or "Error", entry.error_message or ""]


def _encode_reply(reply: CallReply) -> bytes:
    return encode_frame(
        {
            "t": "reply",
            "kind": reply.kind,
            "value": reply.value,
            "error_type": reply.error_type,
            "error_message": reply.error_message,
        }
    )


def _check_names(internal: Sequence[str], external: Mapping[str, Sequence[str]]) -> None:
    """Helper and tool names become variables of the block: refuse what cannot be one."""
    seen: set[str] = set()
    for name in [*internal, *external]:
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("__"):
            raise ValueError(f"{name!r} cannot be a helper or tool name")
        if name in RESERVED_NAMES:
            raise ValueError(f"{name!r} is reserved by the runtime")
        if name in seen:
            raise ValueError(f"{name!r} is both a helper and a tool (or listed twice)")
        seen.add(name)
    for name, params in external.items():
        for param in params:
            if not isinstance(param, str) or not param:
                raise ValueError(f"tool {name!r} has an invalid parameter name {param!r}")


class _Exchange:
    """The conversation with one child about one block: calls in, replies out, then done."""

    def __init__(
        self,
        *,
        worker: _Worker,
        limits: Limits,
        names: Mapping[str, Literal["internal", "external"]],
        journal: Sequence[JournalEntry],
        on_call: OnCall,
    ) -> None:
        self._worker = worker
        self._limits = limits
        self._names = names
        self._replay = journal
        self._on_call = on_call
        self._new: list[JournalEntry] = []
        self._replayed = 0
        self._pending: HelperCall | None = None
        self._live = False  # a call reached the parent

    @property
    def journal(self) -> list[JournalEntry]:
        """Replayed entries, then the calls answered in this run, in call order."""
        return [*self._replay[: self._replayed], *self._new]

    async def run(self, request: bytes) -> BlockOutcome:
        """Send the block, answer its calls, return its outcome; _BlockFailed if it fails."""
        limits = self._limits
        # stdout, results and the error are each capped at stdout_bytes in the child (and JSON
        # may escape a byte into six); a call's arguments may be large on their own.
        max_header = MAX_HEADER_BYTES + 20 * limits.stdout_bytes
        loop = asyncio.get_running_loop()
        remaining = limits.wall_clock_seconds + _KILL_GRACE_SECONDS
        try:
            await self._worker.send(request)
            while True:
                began = loop.time()
                try:
                    async with asyncio.timeout(remaining):
                        header, blob = await self._worker.read(
                            max_blob=limits.snapshot_bytes, max_header=max_header
                        )
                except TimeoutError:
                    raise _BlockFailed("limit", limit_label("wall_clock", limits.model_dump())) from None
                remaining -= loop.time() - began
                match header["t"]:
                    case "call" if self._pending is None:
                        await self._answer(_CallFrame.model_validate(header))
                    case "done":
                        return self._done(_DoneFrame.model_validate(header), blob)
                    case "exit":
                        raise _exit_failure(_ExitFrame.model_validate(header), limits)
                    case tag:
                        raise _BlockFailed("error", f"SandboxError: unexpected {tag!r} frame")
        except FrameError as exc:
            raise _BlockFailed("error", f"SandboxError: {exc}") from None
        except ValidationError as exc:
            raise _BlockFailed("error", f"SandboxError: malformed frame: {exc.errors()[0]}") from None

    async def _answer(self, frame: _CallFrame) -> None:
        call = frame.call
        if self._names.get(call.name) != call.kind:
            raise _BlockFailed("error", f"SandboxError: call to an unknown {call.kind} {call.name!r}")
        # Calls reach the parent only once the whole journal has been replayed.
        self._replayed = len(self._replay)
        self._live = True
        reply = await self._on_call(call)
        try:
            data = _encode_reply(reply)
        except (TypeError, ValueError) as exc:
            # Journal values must be JSON; tell the code rather than fail the whole turn.
            logger.warning("reply to %s is not JSON: %s", call.name, exc)
            reply = CallReply(
                kind="error",
                error_type="TypeError",
                error_message=f"{call.name} returned a value that is not JSON: {exc}",
            )
            data = _encode_reply(reply)
        if reply.kind == "suspend":
            self._pending = call
        else:
            self._new.append(
                JournalEntry(
                    name=call.name,
                    digest=frame.digest,
                    value=reply.value if reply.kind == "value" else None,
                    error_type=(reply.error_type or "Error") if reply.kind == "error" else None,
                    error_message=(reply.error_message or "") if reply.kind == "error" else None,
                )
            )
        await self._worker.send(data)

    def _done(self, frame: _DoneFrame, blob: bytes) -> BlockOutcome:
        if (frame.status == "suspended") != (self._pending is not None):
            raise _BlockFailed("error", "SandboxError: the block's process ignored a suspend")
        if frame.replayed > len(self._replay) or (self._live and frame.replayed != len(self._replay)):
            raise _BlockFailed("error", "SandboxError: inconsistent replay count")
        self._replayed = frame.replayed
        keep_snapshot = frame.status in ("ok", "error") and bool(blob)
        # Every field is validated already (the frame above, the journal by its model).
        return BlockOutcome.model_construct(
            status=frame.status,
            stdout=frame.stdout,
            results=frame.results,
            error=frame.error,
            limit=frame.limit,
            snapshot=blob if keep_snapshot else None,
            dropped=frame.dropped,
            journal=self.journal,
            pending=self._pending,
            duration_ms=0.0,
        )
