"""The pool's workers through their lives: forked from a zygote, idle with a child waiting,
running a block, bound to a conversation, rearming (their next child forked), retired and
replaced; each move is ``WorkerState`` and wakes whoever waits for a worker (no polling).

The request path never spawns or forks: each idle worker has a child already waiting for its
block. After a block the worker forks the next child in the background. A worker whose child
ended abnormally (killed, sent garbage, timed out) is retired (killed) and replaced in the
background, so the framing can never get out of step. Each worker may have a cgroup of its own
that bounds its block's whole process tree (``isolation.cgroups``).

Blocks waiting for a worker are served fairly between tenants, in turn: a free worker goes to the
waiting block whose tenant runs the fewest blocks now, then whose tenant was served longest ago,
then the oldest. A tenant with fifty blocks waiting then delays its own, not another tenant's."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog
from pydantic import ValidationError

from app.runtime import isolation, landlock
from app.runtime.backend import PROJECT_ROOT, BackendChoice
from app.runtime.exchange import REARM_TIMEOUT_SECONDS
from app.runtime.frames import ExitFrame
from app.runtime.isolation.cgroups import DEFAULT_ROOT as DEFAULT_CGROUP_ROOT
from app.runtime.isolation.cgroups import WORKER_TASKS
from app.runtime.protocol import FrameError
from app.runtime.schemas import Limits
from app.runtime.worker_process import WorkerGone, WorkerProcess, WorkerState, worker_env
from app.runtime.zygote import Zygote

log = structlog.get_logger(__name__)

_START_TIMEOUT_SECONDS: Final = 120.0  # a cold first import of numpy+pandas+matplotlib is slow
_CLOSE_TIMEOUT_SECONDS: Final = 10.0
_STOP_TIMEOUT_SECONDS: Final = 5.0  # a retired worker is gone by then, or its zygote is killed
_MAX_RESPAWN_DELAY: Final = 30.0
_SERVED_REMEMBERED: Final = 1024  # tenants whose last service the line remembers (then pruned)


@dataclass(eq=False, slots=True)
class _Waiter:
    """A block waiting for a worker: whose it is, and its place in the line."""

    tenant: str
    ticket: int


class WorkerSupervisor:
    """Keeps ``size`` workers free of conversations (and up to ``live_processes`` more for the
    ones bound to a conversation, where a worker is a cheap fork of a running zygote); a free
    worker beyond ``size`` that stays idle ``surplus_idle_seconds`` goes.

    ``evict``: asked to make a bound process give its worker back when a block waits and every
    worker is busy with none about to be free; False when none is bound."""

    def __init__(
        self,
        choice: BackendChoice,
        *,
        size: int,
        preload: Sequence[str],
        live_processes: int,
        surplus_idle_seconds: float,
        cgroup_root: Path | None = DEFAULT_CGROUP_ROOT,
        evict: Callable[[], bool],
        lazy: bool = False,
    ) -> None:
        self._choice = choice
        self._size = size
        self._preload = tuple(preload)
        self._live_processes = live_processes
        self._surplus_idle_seconds = surplus_idle_seconds
        self._evict = evict
        # Lazy: the workers start at the first ``acquire``, not in ``start`` (once, under the lock).
        self._lazy = lazy
        self._started = False
        self._start_lock = asyncio.Lock()
        # Workers not retired, each in its state; the idle ones also in ``_idle``, first come first
        # served. Any change that may let a waiting ``acquire`` go on resolves ``_changed``.
        self.workers: set[WorkerProcess] = set()
        # The processes that fork the workers (one, unless blocks could signal their neighbours).
        self.zygotes: list[Zygote] = []
        self._zygote_lock = asyncio.Lock()
        self._idle: deque[WorkerProcess] = deque()
        # Blocks waiting for a worker, in the order they came (``_first_in_line`` picks among them),
        # and when each tenant's block last got a worker (a ticket number).
        self._waiters: list[_Waiter] = []
        self._tickets = itertools.count()
        self._served: dict[str, int] = {}
        self._changed: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self._spawn_error: str | None = None  # why the last replacement failed to start
        # Workers being forked beyond ``size`` so that bound processes do not take the free ones.
        self._growing = 0
        self._trimming: asyncio.Task[None] | None = None
        # Whether a worker is a fork of a running zygote (known once a zygote started): otherwise
        # each is a bubblewrap and an interpreter of its own, too dear to start for one conversation.
        self.cheap_workers = False
        # A cgroup per worker under this cgroup file system (None: none), or why there is none:
        # then blocks are limited per process only.
        self._cgroup_root = cgroup_root
        self.cgroups: isolation.Cgroups | None = None
        self.cgroups_problem: str | None = None

    # States ----------------------------------------------------------------------------------

    @property
    def idle_workers(self) -> int:
        """Workers whose child is forked and waiting for a block (for readiness and metrics)."""
        return sum(1 for worker in self.workers if worker.state is WorkerState.IDLE)

    @property
    def waiting(self) -> int:
        """Blocks waiting in line for a worker."""
        return len(self._waiters)

    @property
    def can_take_block(self) -> bool:
        """Whether a block would get a worker without waiting for another block to end: one is
        idle, or (lazy) none was started yet and the block's ``acquire`` starts them."""
        return self.idle_workers > 0 or (self._lazy and not self._started and not self.closed)

    def set_state(self, worker: WorkerProcess, state: WorkerState) -> None:
        """Move ``worker`` to ``state``; an idle one queues for ``acquire``, which is woken (and,
        when the pool holds more free workers than ``size``, goes if it stays idle)."""
        worker.state = state
        if state is WorkerState.IDLE:
            worker.idle_since = time.monotonic()
            self._idle.append(worker)
            if self._trimming is None and self._surplus() > 0:
                self._trimming = self.background(self._trim())
        self._wake()

    @property
    def bound_capacity(self) -> int:
        """How many processes may be bound to conversations at once: ``live_processes`` (forked
        as needed beside the ``size`` free workers), or ``size - 1`` of the workers themselves
        without them, or where a worker is not a cheap fork."""
        return max(self._size - 1, self._live_processes if self.cheap_workers else 0)

    def _free(self) -> int:
        """Workers free of conversations (running a block, idle, rearming, starting)."""
        return sum(1 for w in self.workers if w.state is not WorkerState.BOUND)

    def _surplus(self) -> int:
        """How many more workers than ``size`` are free of conversations."""
        return self._free() - self._size

    def grow(self) -> None:
        """Keep ``size`` workers free of conversations: fork one more when a process was just
        bound, up to ``size + live_processes`` workers in all."""
        if not self._live_processes or self.closed or not self.cheap_workers:
            return
        room = len(self.workers) + self._growing < self._size + self._live_processes
        if room and self._free() + self._growing < self._size:
            self._growing += 1
            self.background(self._add_worker())

    async def _add_worker(self) -> None:
        try:
            worker = await self._spawn()
        except Exception as exc:  # the pool goes on with what it has: bound ones give way as before
            log.warning("sandbox_worker_not_added", reason=str(exc) or type(exc).__name__)
            return
        finally:
            self._growing -= 1
            self._wake()  # a waiting block that counted on this worker looks again (and may evict)
        self.set_state(worker, WorkerState.IDLE)

    async def _trim(self) -> None:
        """While more workers than ``size`` are free, those idle ``surplus_idle_seconds`` go,
        the longest idle first (they were forked for processes bound meanwhile)."""
        try:
            while self._surplus() > 0 and not self.closed:
                await asyncio.sleep(self._surplus_idle_seconds / 4)
                before = time.monotonic() - self._surplus_idle_seconds
                idle = [w for w in self.workers if w.state is WorkerState.IDLE and w.idle_since <= before]
                for worker in sorted(idle, key=lambda w: w.idle_since)[: max(self._surplus(), 0)]:
                    self.workers.discard(worker)
                    worker.state = WorkerState.RETIRED  # skipped by ``acquire``; not replaced
                    worker.kill()
        finally:
            self._trimming = None

    def _wake(self) -> None:
        """Let every waiting ``acquire`` look again."""
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
    def block_limits(self) -> str:
        """How a block's memory, tasks and CPU time are bounded: per block (its worker's cgroup)
        or per process only; known once started."""
        if self.cgroups is not None:
            return f"per block ({self.cgroups.describe()})"
        return f"per process only ({self.cgroups_problem})"

    # Lifespan ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Make the pool's cgroups, then start ``size`` workers and wait until each has an idle child
        (the backend is chosen); a lazy supervisor starts them at its first ``acquire`` instead.
        RuntimeError when one fails to start."""
        isolation.raise_descriptor_limit()  # before any worker's channel is passed to a zygote
        await self._open_cgroups()
        if not self._lazy:
            await self._start_workers()

    async def _start_workers(self) -> None:
        """The first ``size`` workers, once (a failure closes the pool, as at start-up)."""
        async with self._start_lock:
            if self._started:
                return
            if self.closed:
                raise RuntimeError("the runtime pool is closed")
            results = await asyncio.gather(
                *(self._spawn() for _ in range(self._size)), return_exceptions=True
            )
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:
                await self.aclose()
                raise RuntimeError(f"sandbox worker failed to start: {failures[0]}") from failures[0]
            for worker in results:
                assert isinstance(worker, WorkerProcess)
                self.set_state(worker, WorkerState.IDLE)
            self._started = True

    async def aclose(self) -> None:
        """Kill every worker (and child); blocks still running end with an error."""
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        for worker in self.workers:
            worker.state = WorkerState.RETIRED
        zygotes = list(self.zygotes)
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
        self.workers.clear()
        self.zygotes.clear()
        if self.cgroups is not None:
            await self.cgroups.close()

    async def _open_cgroups(self) -> None:
        """Make this pool's cgroups (removing a dead server's first, which may take a moment),
        or say once that blocks are limited per process only."""
        if self._cgroup_root is None:
            self.cgroups_problem = "no cgroup root was given"
        else:
            try:
                self.cgroups = await asyncio.to_thread(isolation.open_cgroups, self._cgroup_root)
            except isolation.CgroupsUnavailable as exc:
                self.cgroups_problem = str(exc)
        if self.cgroups is not None:
            log.info("sandbox_block_limits", per="block", cgroups=self.cgroups.describe())
            return
        log.warning(
            "sandbox_memory_per_process",
            reason=self.cgroups_problem,
            consequence=(
                "blocks' memory, CPU time and processes are limited per process only: a block that "
                "starts its max_processes can hold that many times memory_mb"
            ),
        )

    def background(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task the supervisor owns (``aclose`` cancels what is left)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # Starting workers ------------------------------------------------------------------------

    async def _spawn(self) -> WorkerProcess:
        """Fork one worker from a zygote (starting a zygote when none may fork another) and wait
        for its first idle child."""
        worker: WorkerProcess | None = None
        cgroup = None if self.cgroups is None else self.cgroups.create()
        try:
            async with asyncio.timeout(_START_TIMEOUT_SECONDS):
                stats = [] if cgroup is None else cgroup.stat_fds()
                try:
                    worker = await self._clone(stats)
                finally:
                    for fd in stats:
                        os.close(fd)
                worker.cgroup = cgroup
                self.workers.add(worker)
                self.background(self._watch(worker))
                await worker.await_ready()
                if cgroup is not None:
                    self._place(worker, cgroup)
        except BaseException:
            if worker is not None:
                self.workers.discard(worker)  # the caller retries (or fails): no replacement
                worker.kill()
            elif cgroup is not None:
                self.background(self._remove_cgroup(cgroup))
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
        if self.cgroups is not None:
            try:
                await self.cgroups.remove(cgroup)
            except OSError as exc:
                log.warning("sandbox_cgroup_left", cgroup=str(cgroup.memory), reason=str(exc))

    async def _clone(self, stats: Sequence[int]) -> WorkerProcess:
        """A new worker of a zygote that may fork one, in the order asked. A zygote found dead
        on the way (its death not yet noticed), or that dies as it starts, is put down and
        another one started, once."""
        retried = False
        async with self._zygote_lock:
            while True:
                zygote = next((z for z in self.zygotes if not z.full), None)
                try:
                    if zygote is None:
                        zygote = await self._start_zygote()  # put down already if it failed
                        self.zygotes.append(zygote)
                        self.background(self._watch_zygote(zygote))
                    return await zygote.clone(stats)
                except WorkerGone:
                    if zygote is not None:
                        zygote.kill()
                    if retried:
                        raise
                    retried = True

    async def _start_zygote(self) -> Zygote:
        """Start a zygote process (it imports the preloaded modules, then forks workers)."""
        choice = self._choice
        backend = choice.backend
        assert backend is not None, "the backend is chosen before workers start"
        command = [sys.executable, "-m", "app.runtime.worker", "--zygote"]
        command += ["--preload", ",".join(self._preload), "--isolation", backend]
        if choice.workspaces is not None:
            command += ["--workspaces", str(choice.workspaces)]
        if choice.identity is not None:
            command += ["--identity", str(choice.identity)]
        if backend == "bwrap":
            assert choice.bwrap is not None
            command = choice.bwrap_argv(choice.bwrap, command)
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
                    cwd=PROJECT_ROOT,
                    start_new_session=True,  # its own process group, killed as one
                    pass_fds=choice.pass_fds() if backend == "bwrap" else (),
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
            self.cheap_workers = zygote.capacity is None
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

    # Ending and replacing workers ------------------------------------------------------------

    async def _watch(self, worker: WorkerProcess) -> None:
        """When a worker exits on its own (crash, OOM killer), retire and replace it; then its
        cgroup goes."""
        await worker.exited.wait()
        self.retire(worker)
        if worker.cgroup is not None:
            await self._remove_cgroup(worker.cgroup)

    async def _watch_zygote(self, zygote: Zygote) -> None:
        """A zygote that exits takes its workers with it (each is then retired and replaced)."""
        await zygote.proc.wait()
        zygote.kill()
        with contextlib.suppress(ValueError):
            self.zygotes.remove(zygote)

    async def _ensure_stopped(self, worker: WorkerProcess) -> None:
        """A retired worker stops within moments (its channel was cut); one that does not is taken
        down with its zygote (and the zygote's other workers, which are replaced)."""
        try:
            async with asyncio.timeout(_STOP_TIMEOUT_SECONDS):
                await worker.exited.wait()
        except TimeoutError:
            log.error("sandbox_worker_did_not_stop", worker=worker.pid)
            worker.host.kill()

    def retire(self, worker: WorkerProcess) -> None:
        """Kill a worker that can no longer serve and start its replacement, once.

        Called where the pool gives up on the worker, not when its process is finally reaped:
        the pool's size never depends on how long a killed sandbox takes to go away.
        """
        worker.kill()
        if worker not in self.workers:
            return
        self.workers.discard(worker)
        self.set_state(worker, WorkerState.RETIRED)
        if not self.closed:
            self.background(self._ensure_stopped(worker))
            self.background(self._replace())

    async def _replace(self) -> None:
        delay = 0.5
        while not self.closed:
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
                self.set_state(worker, WorkerState.IDLE)
                return

    def rearm_later(self, worker: WorkerProcess) -> None:
        """After a block: the worker gets its next child in the background (rearming at once, so
        ``acquire`` knows a worker is about to be free)."""
        self.set_state(worker, WorkerState.REARMING)
        self.background(self.rearm(worker, worker.child_pid))

    async def rearm(self, worker: WorkerProcess, child_pid: int | None, *, released: bool = False) -> None:
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
            self.retire(worker)
            return
        if not self.closed:
            self.set_state(worker, WorkerState.IDLE)

    # Handing workers out ---------------------------------------------------------------------

    async def acquire(self, limits: Limits, *, tenant: str = "") -> WorkerProcess:
        """An idle worker, now running ``tenant``'s block, whose cgroup bounds the block's whole
        process tree by ``limits`` (memory, swap, tasks) and counts OOM kills from here; a worker
        whose cgroup the kernel will not set so (v1: more memory in use than the new limit) is
        retired. Waits in line when none is idle (see the module docs)."""
        if not self._started:
            await self._start_workers()
        while True:
            worker = await self._take_idle(tenant)
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
                self.retire(worker)
                continue
            return worker

    async def _take_idle(self, tenant: str) -> WorkerProcess:
        """An idle worker for ``tenant``'s block, waiting in line if all are busy or another
        waiting block comes first; dead ones are skipped.

        Fails rather than wait forever when the pool is closed, or has no worker left and
        cannot start one.
        """
        waiter = _Waiter(tenant, next(self._tickets))
        self._waiters.append(waiter)
        try:
            while True:
                while self._idle and self._first_in_line() is waiter:
                    worker = self._idle.popleft()
                    if worker.state is not WorkerState.IDLE:
                        continue
                    if not worker.alive:
                        self.retire(worker)  # died while idle: replaced, not handed a block
                        continue
                    worker.tenant = tenant
                    self._note_served(tenant)
                    self.set_state(worker, WorkerState.RUNNING)  # wakes the next in line
                    return worker
                if self.closed:
                    raise RuntimeError("the runtime pool is closed")
                if not self.workers and self._spawn_error is not None:
                    raise RuntimeError(f"no sandbox worker can start: {self._spawn_error}")
                if (
                    not self._idle
                    and not self._growing
                    and not any(w.state in (WorkerState.REARMING, WorkerState.STARTING) for w in self.workers)
                ):
                    # Every other worker is running a block (none is about to be free or added): a
                    # bound process gives its worker back (its conversation replays).
                    self._evict()
                await self._changes()
        finally:
            self._waiters.remove(waiter)
            if self._idle and self._waiters:
                self._wake()  # this one left the line (served, or its request went away)

    def _first_in_line(self) -> _Waiter:
        """The waiting block whose tenant runs the fewest blocks now, then whose tenant was
        served longest ago (never: first), then the oldest."""
        if len(self._waiters) == 1:
            return self._waiters[0]
        running = Counter(w.tenant for w in self.workers if w.state is WorkerState.RUNNING)
        return min(
            self._waiters,
            key=lambda waiter: (running[waiter.tenant], self._served.get(waiter.tenant, -1), waiter.ticket),
        )

    def _note_served(self, tenant: str) -> None:
        """Remember that ``tenant``'s block got a worker now; forget tenants with no block
        waiting once many are remembered (one served again then counts as not served lately)."""
        if len(self._served) >= _SERVED_REMEMBERED:
            waiting = {waiter.tenant for waiter in self._waiters}
            self._served = {name: at for name, at in self._served.items() if name in waiting}
        self._served[tenant] = next(self._tickets)

    @staticmethod
    def count_ooms(worker: WorkerProcess) -> None:
        """Count the OOM kills of a bound process's next block from now (its limits are set)."""
        if worker.cgroup is not None:
            with contextlib.suppress(OSError):
                worker.cgroup.oom_before = worker.cgroup.oom_kills()

    @staticmethod
    def out_of_memory(worker: WorkerProcess) -> bool:
        """Whether the OOM killer struck in the worker's cgroup during its current block."""
        if worker.cgroup is None:
            return False
        try:
            return worker.cgroup.oom_kills() > worker.cgroup.oom_before
        except OSError:
            return False
