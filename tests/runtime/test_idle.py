"""A pool with nothing to run stays asleep: its workers, ready or holding a live conversation's
process, do not wake up on a timer (each one's quota watchdog woke 20 times a second, so 16 live
conversations kept the sandbox at about 2% of a core while the server was idle)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from app.runtime import Limits, RuntimePool
from tests.runtime.support import BACKENDS, pool_processes, run, started_pool, thread_switches

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=BACKENDS)
async def pool(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """Two workers; a live process stays bound for 30 s."""
    async with started_pool(request.param, workspaces, size=2, live_seconds=30.0) as started:
        yield started


async def test_workers_sleep_while_nothing_runs(pool: RuntimePool, workspaces: Path) -> None:
    conversation = workspaces / f"idle-{os.urandom(4).hex()}"
    conversation.mkdir()
    limits = Limits(disk_mb=1)
    outcome = await run(pool, "x = 1\nresult(x)", workdir=conversation, limits=limits)
    assert outcome.status == "ok", outcome.error
    await asyncio.sleep(0.5)  # its worker forks the next child; the live one waits
    assert pool.live_processes == 1
    workers = pool_processes(pool, "workers")
    assert len(workers) >= 2, workers  # one ready, one holding the live process
    before = {pid: thread_switches(pid) for pid in workers}
    await asyncio.sleep(1.0)
    woke = {pid: thread_switches(pid) - count for pid, count in before.items()}
    assert all(count <= 2 for count in woke.values()), woke  # was 20 or more each
    # The watchdog of the live process wakes for its next block: past its disk quota, a block
    # that then sleeps is stopped on the watchdog's timer, not at its end.
    began = time.monotonic()
    over = await run(
        pool,
        "open('big.bin', 'wb').write(b'x' * (3 << 20))\nimport time\ntime.sleep(20)\nresult('slept')",
        workdir=conversation,
        snapshot=outcome.snapshot,
        limits=limits,
    )
    assert (over.status, over.process) == ("limit", "live"), (over.status, over.process, over.error)
    assert over.limit is not None
    assert over.limit.startswith("disk"), over.limit
    assert time.monotonic() - began < 5
