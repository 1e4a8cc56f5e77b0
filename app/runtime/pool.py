"""RuntimePool: runs blocks in pre-forked sandbox children of long-lived warm workers, each
worker a fork of one zygote process that imported the heavy modules (``app.runtime.zygote``).

The pool is the runtime's facade: ``run_block`` decides which process serves a block (a fresh
child of an idle worker, the conversation's live process, or its parked block resumed) and keeps
a process bound to its conversation afterwards. The rest is in modules of their own: which
sandbox runs (``app.runtime.backend``), the workers' lifecycle (``app.runtime.supervisor``), the
bound processes (``app.runtime.bound``), one block's frames (``app.runtime.exchange``), the
server's handle on a worker process (``app.runtime.worker_process``) and the frames it accepts
(``app.runtime.frames``).

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
import keyword
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from app.runtime import isolation
from app.runtime.backend import BackendChoice
from app.runtime.bound import Bindings, Bound
from app.runtime.exchange import BlockRequest, Exchange, OnCall
from app.runtime.frames import BlockFailed, LiveGone
from app.runtime.isolation import Backend, Identity, SandboxMode
from app.runtime.isolation.cgroups import DEFAULT_ROOT as DEFAULT_CGROUP_ROOT
from app.runtime.protocol import (
    LIVE_MAX_BLOCKS,
    RESERVED_NAMES,
    SANDBOX_GROUPS,
    SANDBOX_HELPERS,
    FrameError,
    encode_frame,
    limit_label,
)
from app.runtime.schemas import (
    BlockOutcome,
    BlockProcess,
    CallReply,
    HelperCall,
    JournalEntry,
    Limits,
    SandboxTool,
)
from app.runtime.supervisor import WorkerSupervisor
from app.runtime.tiers import Tier, TierRule
from app.runtime.worker_process import WorkerProcess, WorkerState

log = structlog.get_logger(__name__)


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

    ``plain_size`` (0: none): workers of a second zygote that preloads nothing, kept free beside
    the ``size`` preloaded ones, for blocks that name no preloaded module (``app.runtime.tiers``):
    forking them costs about 40% less CPU. They bind processes alike, up to ``live_processes``
    of their own. Without a preload list every worker is plain already and this is ignored.

    ``lazy``: ``start`` chooses the sandbox (its probe fails as before) but forks no worker; the
    first block starts them and waits, as it waits for a busy pool. For servers that rarely run
    code, and for the test suite, whose apps mostly run none.
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
        plain_size: int = 0,
        lazy: bool = False,
    ) -> None:
        if size < 1:
            raise ValueError("a runtime pool needs at least one worker")
        if live_processes < 0 or live_memory_mb < 0 or plain_size < 0:
            raise ValueError("live_processes, live_memory_mb and plain_size cannot be negative")
        self._choice = BackendChoice(sandbox, workspaces=workspaces, fallback=fallback, bwrap=bwrap)
        self.bindings = Bindings(seconds=live_seconds, memory_kb=live_memory_mb * 1024, let_go=self._let_go)
        self.workers = WorkerSupervisor(
            self._choice,
            size=size,
            preload=preload,
            live_processes=live_processes,
            surplus_idle_seconds=surplus_idle_seconds,
            cgroup_root=cgroup_root,
            evict=lambda: self.bindings.give_way("preloaded"),
            lazy=lazy,
        )
        # Processes being readied for a conversation's next block (``prepare``), by workdir.
        self._preparing: dict[Path, asyncio.Task[None]] = {}
        # Workers without the preloads, for the blocks that do not need them (None: none).
        self.plain: WorkerSupervisor | None = None
        self._tiers = TierRule(preload)
        if plain_size and self._tiers.roots:
            self.plain = WorkerSupervisor(
                self._choice,
                size=plain_size,
                preload=(),
                live_processes=live_processes,
                surplus_idle_seconds=surplus_idle_seconds,
                cgroup_root=cgroup_root,
                evict=lambda: self.bindings.give_way("plain"),
                lazy=lazy,
            )

    def supervisor(self, tier: Tier) -> WorkerSupervisor:
        """The workers of ``tier`` (the preloaded ones when the pool has no plain workers)."""
        return self.plain if tier == "plain" and self.plain is not None else self.workers

    def _tier(self, code: str, *, snapshot: bytes, sandbox_tools: Sequence[SandboxTool]) -> Tier:
        """Where a fresh block runs: on plain workers when the pool has them and the block names
        no preloaded module (``TierRule``), else on the preloaded ones."""
        if self.plain is None:
            return "preloaded"
        return self._tiers.tier(code, snapshot=snapshot, sources=[tool.source for tool in sandbox_tools])

    @property
    def idle_workers(self) -> int:
        """Workers whose child is forked and waiting for a block (for readiness and metrics)."""
        return self.workers.idle_workers + (0 if self.plain is None else self.plain.idle_workers)

    @property
    def every_kind_idle(self) -> bool:
        """Whether a worker of each kind (preloaded, plain) is idle, or not started yet in a lazy
        pool, so that a block of either could start now without waiting for another block: a
        sub-task's check, whose parent block holds its own worker meanwhile."""
        return self.workers.can_take_block and (self.plain is None or self.plain.can_take_block)

    @property
    def parked_blocks(self) -> int:
        """Paused blocks whose process waits for a resume here."""
        return self.bindings.parked

    @property
    def live_processes(self) -> int:
        """Processes bound to a conversation between its blocks."""
        return self.bindings.live

    @property
    def sandbox(self) -> Backend:
        """The isolation backend in use (``bwrap`` or ``process``); known once started."""
        if self._choice.backend is None:
            raise RuntimeError("the runtime pool is not started")
        return self._choice.backend

    @property
    def fallback_reason(self) -> str | None:
        """Why ``auto`` chose ``process`` (bubblewrap's problem here); None when it did not."""
        return self._choice.fallback_reason

    @property
    def workspaces(self) -> Path | None:
        """The directory holding the conversations' working directories (resolved once started)."""
        return self._choice.workspaces

    @property
    def cgroups(self) -> isolation.Cgroups | None:
        """The workers' cgroups, when the host allows them (else ``cgroups_problem`` says why)."""
        return self.workers.cgroups

    @property
    def cgroups_problem(self) -> str | None:
        return self.workers.cgroups_problem

    @property
    def block_limits(self) -> str:
        """How a block's memory, tasks and CPU time are bounded: per block (its worker's cgroup)
        or per process only; known once started."""
        return self.workers.block_limits

    @property
    def sandbox_owner(self) -> Identity | None:
        """The host uid/gid blocks run as when the server runs as root (files the server writes
        into a working directory are readable by it, writable only once chowned to it)."""
        return self._choice.identity

    # Lifespan ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Choose the sandbox, start the workers and wait until each has an idle child.

        RuntimeError when ``sandbox="bwrap"`` and bubblewrap does not work here (saying why), or
        when a worker fails to start.
        """
        await self._choice.choose()
        try:
            await self.workers.start()
        except BaseException:
            self._choice.close()
            raise
        if self.plain is not None:
            try:
                await self.plain.start()
            except BaseException:
                await self.workers.aclose()
                self._choice.close()
                raise

    async def aclose(self) -> None:
        """Kill every worker (and child); blocks still running end with an error."""
        self.bindings.close()  # their workers are killed with the rest
        await self.workers.aclose()
        if self.plain is not None:
            await self.plain.aclose()
        self._choice.close()

    async def __aenter__(self) -> RuntimePool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

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
        tenant: str = "",
    ) -> BlockOutcome:
        """Run one block in a fresh sandbox child and return how it ended.

        ``journal`` entries are replayed (inside the child, without calling ``on_call``)
        before any call reaches ``on_call``. ``limits.wall_clock_seconds`` counts the child's
        own time: it stops while ``on_call`` runs. An exception from ``on_call`` (or
        cancellation) kills the block and propagates. ``sandbox_tools`` run in the child itself
        and are journaled there (never reaching ``on_call``). ``tenant``: whose share of the
        workers a fresh child takes when blocks wait for one (``WorkerSupervisor``).
        """
        if self.workers.closed:
            raise RuntimeError("the runtime pool is closed")
        _check_names([*internal_helpers, *(tool.name for tool in sandbox_tools)], external_tools)
        if not workdir.is_absolute():
            raise ValueError(f"workdir must be an absolute path, not {workdir}")
        workdir = self._block_workdir(workdir)
        preparing = self._preparing.get(workdir)
        if preparing is not None:
            # Its process is being readied: wait for it (a fresh fork meanwhile would be a second
            # process for the conversation). Only waited for: cancelling this call leaves it be.
            await asyncio.wait({preparing})
        state = snapshot or b""
        block = BlockRequest(
            code=code,
            workdir=workdir,
            limits=limits,
            internal_helpers=internal_helpers,
            external_tools=external_tools,
            journal=journal,
            sandbox_tools=sandbox_tools,
            tenant=tenant,
        )
        started = time.perf_counter()
        tier: Tier  # the kind of worker that runs it, as each path below finds
        dropped: tuple[str, ...] = ()  # names a prepared process could not restore
        bound = self.bindings.take(workdir)
        exchange: Exchange | None = None
        process: BlockProcess = "fresh"
        if bound is not None and bound.exchange is not None:
            if bound.resumed_by(code=code, limits=limits, journal=journal):
                worker, exchange, blocks, tier = bound.worker, bound.exchange, bound.blocks, bound.tier
                workers = self.supervisor(tier)
                workers.set_state(worker, WorkerState.RUNNING)
                workers.count_ooms(worker)
                process = "resumed"
                running = exchange.resume(journal[-1], on_call=on_call)
            else:
                self._let_go(bound)
        elif bound is not None:
            if (
                bound.limits == limits
                and (bound.state is state or bound.state == state)
                and bound.blocks < LIVE_MAX_BLOCKS
                # A plain process runs a block that names no preloaded module (its namespace is
                # the snapshot, so that is not looked at again).
                and (
                    bound.tier == "preloaded"
                    or self._tier(code, snapshot=b"", sandbox_tools=sandbox_tools) == "plain"
                )
            ):
                worker, blocks, tier = bound.worker, bound.blocks + 1, bound.tier
                workers = self.supervisor(tier)
                workers.set_state(worker, WorkerState.RUNNING)
                workers.count_ooms(worker)
                exchange = self._exchange(worker, block=block, on_call=on_call)
                keep = self._keeps(blocks)
                process = "prepared" if bound.prepared else "live"
                dropped = bound.dropped
                running = exchange.run(
                    block.encode(keep=keep, live_pid=worker.child_pid), keep=keep, live_run=True
                )
            else:
                self._let_go(bound)
        if exchange is None:
            tier = self._tier(code, snapshot=state, sandbox_tools=sandbox_tools)
            workers = self.supervisor(tier)
            worker, blocks = await workers.acquire(limits, tenant=tenant), 1
            started = time.perf_counter()
            exchange = self._exchange(worker, block=block, on_call=on_call)
            keep = self._keeps(blocks)
            running = exchange.run(block.encode(keep=keep, snapshot=state), keep=keep)
        try:
            try:
                outcome = await running
            except LiveGone:
                # The live process died between blocks: its worker has a fresh child now.
                blocks, process, dropped = 1, "fresh", ()
                exchange = self._exchange(worker, block=block, on_call=on_call)
                keep = self._keeps(blocks)
                outcome = await exchange.run(block.encode(keep=keep, snapshot=state), keep=keep)
        except BlockFailed as lost:
            failed = lost
            if failed.failure == "worker_lost" and workers.out_of_memory(worker):
                # The OOM killer took the worker itself (a block's processes go first, but a
                # block may lower their score back): its cgroup says why.
                failed = BlockFailed("limit", limit_label("memory", limits.model_dump()))
            workers.retire(worker)
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
            workers.retire(worker)
            raise
        if outcome is None:  # parked: suspended, with its process kept
            self._bind(
                workdir,
                Bound(worker=worker, limits=limits, blocks=blocks, tier=tier, exchange=exchange, code=code),
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
        if dropped:  # as a fresh block would have said, restoring the same snapshot
            outcome.dropped = list(dict.fromkeys([*dropped, *outcome.dropped]))
        if exchange.live:
            kept = outcome.snapshot if outcome.snapshot is not None else state
            bound = Bound(worker=worker, limits=limits, blocks=blocks, tier=tier, state=kept)
            bound.memory_kb = exchange.grown_kb
            self._bind(workdir, bound)
        else:
            workers.rearm_later(worker)
        return outcome

    def prepare(
        self,
        *,
        snapshot: bytes | None,
        workdir: Path,
        limits: Limits,
        internal_helpers: Sequence[str],
        external_tools: Mapping[str, Sequence[str]],
        sandbox_tools: Sequence[SandboxTool] = (),
        tenant: str = "",
    ) -> bool:
        """Ready a process for ``workdir``'s next block while its code is still being written
        (the model's answer has opened a block): in the background, a fresh child enters the
        directory, restores ``snapshot`` and stays bound to the conversation as a live process
        does after a block. The block, when ``run_block`` gets it with the same snapshot, limits
        and names, then starts as a live process's next block does, without a fork or a restore
        on its way; its outcome says ``prepared``.

        Nothing happens (False) when processes may not stay bound (``live_seconds`` 0, no room),
        one is bound to ``workdir`` already or being readied, or ``workdir`` is not one the pool
        runs blocks in. A readying that fails is logged only: the block then starts fresh.
        Restoring runs the snapshot's own code (what its objects do when unpickled) before the
        block is known, as the block's own start would; a block that never comes leaves the
        process to expire like any live one."""
        if not self._may_bind() or not workdir.is_absolute():
            return False
        try:
            workdir = self._block_workdir(workdir)
        except ValueError:
            return False
        if workdir in self._preparing or self.bindings.holds(workdir):
            return False
        _check_names([*internal_helpers, *(tool.name for tool in sandbox_tools)], external_tools)
        block = BlockRequest(
            code="",
            workdir=workdir,
            limits=limits,
            internal_helpers=internal_helpers,
            external_tools=external_tools,
            journal=(),
            sandbox_tools=sandbox_tools,
            tenant=tenant,
        )
        task = self.workers.background(self._prepare(block, state=snapshot or b""))
        self._preparing[workdir] = task
        task.add_done_callback(lambda done: self._prepared(workdir, done))
        return True

    def _prepared(self, workdir: Path, task: asyncio.Task[None]) -> None:
        if self._preparing.get(workdir) is task:
            del self._preparing[workdir]

    async def _prepare(self, block: BlockRequest, *, state: bytes) -> None:
        """``prepare``'s background part: a fresh child restores ``state`` and stays live."""
        tier = self._tier("", snapshot=state, sandbox_tools=block.sandbox_tools)
        workers = self.supervisor(tier)
        try:
            worker = await workers.acquire(block.limits, tenant=block.tenant)
        except RuntimeError as exc:  # closed meanwhile, or no worker can start: the block will say
            log.warning("sandbox_prepare_failed", reason=str(exc))
            return
        exchange = self._exchange(worker, block=block, on_call=_no_call_while_preparing)
        keep = self._keeps(1)
        try:
            outcome = await exchange.run(block.encode(keep=keep, snapshot=state, prepare=True), keep=keep)
        except (BlockFailed, _CallWhilePreparing) as failed:
            log.warning("sandbox_prepare_failed", worker=worker.pid, reason=str(failed))
            workers.retire(worker)
            return
        except BaseException:
            workers.retire(worker)
            raise
        if outcome is None or outcome.status != "ok" or not exchange.live or exchange.journal:
            # It could not stay (a thread its snapshot started, no room meanwhile), or restoring
            # ran a journaled helper (an object of the snapshot that writes a file as it loads),
            # whose entry belongs at the head of the block's journal: the block starts fresh,
            # and restores the snapshot itself.
            if outcome is not None and (outcome.status != "ok" or exchange.journal):
                why = outcome.error or outcome.limit or "restoring journaled a call"
                log.info("sandbox_prepare_ended", status=outcome.status, why=why)
            if exchange.live:
                self._let_go(Bound(worker=worker, limits=block.limits, blocks=1, tier=tier))
            else:
                workers.rearm_later(worker)
            return
        bound = Bound(
            worker=worker,
            limits=block.limits,
            blocks=1,
            tier=tier,
            state=state,
            prepared=True,
            dropped=tuple(outcome.dropped),
        )
        bound.memory_kb = exchange.grown_kb
        self._bind(block.workdir, bound)

    def _exchange(self, worker: WorkerProcess, *, block: BlockRequest, on_call: OnCall) -> Exchange:
        return Exchange(
            worker=worker,
            limits=block.limits,
            names=block.runners,
            journal=block.journal,
            on_call=on_call,
            local=frozenset(tool.name for tool in block.sandbox_tools),
            may_park=self._may_bind,
            replayed_bytes=block.replayed_bytes,
        )

    # Processes bound to a conversation -----------------------------------------------------

    def _keeps(self, blocks: int) -> bool:
        """Whether the process of a block (its ``blocks``-th) is asked to stay live after it."""
        return self._may_bind() and blocks < LIVE_MAX_BLOCKS

    def _may_bind(self) -> bool:
        """Whether a process may stay bound to its conversation after a block (or its pause)."""
        return self.bindings.seconds > 0 and not self.workers.closed and self.workers.bound_capacity > 0

    def _bind(self, workdir: Path, bound: Bound) -> None:
        """Keep ``bound`` for ``workdir``'s next block (``Bindings.keep``); its worker is bound,
        and one more is forked to keep ``size`` free."""
        workers = self.supervisor(bound.tier)
        if self.bindings.keep(workdir, bound, capacity=workers.bound_capacity):
            workers.set_state(bound.worker, WorkerState.BOUND)
            workers.grow()

    def _let_go(self, bound: Bound) -> None:
        """Release ``bound`` in the background; its worker counts as rearming from now on, so a
        waiting ``acquire`` woken meanwhile does not make another bound process give way too."""
        workers = self.supervisor(bound.tier)
        workers.set_state(bound.worker, WorkerState.REARMING)
        workers.background(self._release(bound))

    async def _release(self, bound: Bound) -> None:
        """Let a bound process stop (a parked block as suspended), then give its worker its
        next child (the worker is rearming throughout)."""
        worker, workers = bound.worker, self.supervisor(bound.tier)
        if worker.state is not WorkerState.REARMING:
            workers.set_state(worker, WorkerState.REARMING)
        try:
            if bound.exchange is not None:
                await bound.exchange.release()
            else:
                await worker.send(encode_frame({"t": "release"}))
        except (BlockFailed, FrameError) as exc:
            log.warning("sandbox_worker_recycled", worker=worker.pid, reason=str(exc), bound=True)
            workers.retire(worker)
            return
        await workers.rearm(worker, worker.child_pid, released=bound.exchange is None)

    def _block_workdir(self, workdir: Path) -> Path:
        """The workdir as the child gets it: resolved, checked to lie inside the workspaces (when
        the pool has them), owned by the sandbox identity (when the server is root)."""
        workspaces_dir = self._choice.workspaces
        if workspaces_dir is None:
            isolation.adopt(workdir, self.owner_of(workdir))
            return workdir
        # On strings (os.path), not pathlib: this runs for every block, and pathlib's parsing
        # was a third of the server's own time for a live process's block.
        resolved = os.path.realpath(workdir)
        workspaces = str(workspaces_dir)
        if not resolved.startswith(workspaces.rstrip("/") + "/"):
            raise ValueError(f"workdir {resolved} is not inside the workspaces {workspaces_dir}")
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
        return isolation.conversation_identity(str(workdir), base=self._choice.identity, backend=self.sandbox)


class _CallWhilePreparing(Exception):
    """A helper called while a process was being readied (its snapshot's objects, unpickled)."""

    def __str__(self) -> str:
        return f"restoring the snapshot called {self.args[0]}: the block starts fresh instead"


async def _no_call_while_preparing(call: HelperCall) -> CallReply:
    """No block runs while a process is readied: a call then (from the snapshot's own code)
    ends the readying, and the block starts fresh, where that call is the block's own."""
    raise _CallWhilePreparing(call.name)


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
