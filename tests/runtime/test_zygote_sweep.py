"""What a block left running outlives its worker only for a moment: a daemon of the block (its own
session, orphaned twice) that the worker never got to kill at the block's end, because the worker
itself died mid-block (the OOM killer, a crash), comes to the zygote, which kills it. The zygote
also sleeps while nothing happens (it swept for such orphans five times a second, idle or not)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from app.runtime.worker_process import WorkerState
from tests.runtime.support import (
    BACKENDS,
    host_pid,
    host_processes_with,
    pool_processes,
    run,
    started_pool,
    thread_switches,
    wait_until_gone,
)

_DAEMON = """
import ctypes, os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(15, b"{marker}", 0, 0, 0)
        while True:
            time.sleep(0.05)
    os._exit(0)
time.sleep(30)
"""


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_daemon_of_a_block_whose_worker_died_is_killed(
    backend: str, workspaces: Path, tmp_path: Path
) -> None:
    marker = f"orph{os.urandom(3).hex()}"
    async with started_pool(backend, workspaces, size=1) as pool:  # type: ignore[arg-type]
        running = asyncio.ensure_future(run(pool, _DAEMON.format(marker=marker), workdir=tmp_path))
        deadline = time.monotonic() + 10
        while not host_processes_with(marker):
            assert time.monotonic() < deadline, "the block's daemon did not start"
            await asyncio.sleep(0.02)
        (worker,) = [w for w in pool.workers.workers if w.state == WorkerState.RUNNING]
        os.kill(host_pid(worker), signal.SIGKILL)
        outcome = await running
        assert outcome.failure == "worker_lost", (outcome.status, outcome.error)
        assert await wait_until_gone(marker, seconds=3) == []


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_zygote_sleeps_while_nothing_happens(
    backend: str, workspaces: Path, tmp_path: Path
) -> None:
    async with started_pool(backend, workspaces, size=1) as pool:  # type: ignore[arg-type]
        outcome = await run(pool, "result(1)", workdir=tmp_path)
        assert outcome.status == "ok", outcome.error
        await asyncio.sleep(0.3)
        found = pool_processes(pool, "zygote")
        assert found
        before = {pid: thread_switches(pid) for pid in found}
        await asyncio.sleep(1.0)
        woke = {pid: thread_switches(pid) - count for pid, count in before.items()}
        assert all(count <= 1 for count in woke.values()), woke  # was 5 a second
