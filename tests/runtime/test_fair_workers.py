"""Blocks waiting for a sandbox worker are served fairly between tenants (``WorkerSupervisor``):
a free worker goes to the waiting block whose tenant runs the fewest blocks, then whose tenant was
served longest ago, then the oldest. Before, the line was first come, first served: a tenant that
sent many blocks at once held every worker until all of them had run, and another tenant's one
block waited behind them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.runtime import RuntimePool
from app.runtime.isolation import Backend
from tests.runtime.support import BACKENDS, conversation, run, started_pool

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.parametrize("backend", BACKENDS)]

# Each block holds its worker a while and says when it started (the clock is system-wide).
HOLD = "import time\nprint(time.monotonic())\ntime.sleep(0.3)"


async def _started_at(pool: RuntimePool, workspaces: Path, *, tenant: str) -> float:
    outcome = await run(pool, HOLD, workdir=conversation(workspaces), tenant=tenant)
    assert outcome.status == "ok", outcome.error
    return float(outcome.stdout)


async def _queued(pool: RuntimePool, waiting: int) -> None:
    """Until ``waiting`` blocks wait in line for a worker."""
    deadline = time.monotonic() + 10
    while pool.workers.waiting < waiting:
        assert time.monotonic() < deadline, "the blocks never queued"
        await asyncio.sleep(0.01)


async def test_another_tenants_block_goes_before_a_tenants_backlog(
    backend: Backend, workspaces: Path
) -> None:
    async with started_pool(backend, workspaces, size=1) as pool:
        first = asyncio.create_task(_started_at(pool, workspaces, tenant="acme"))
        await _queued(pool, 0)
        deadline = time.monotonic() + 10
        while pool.workers.idle_workers:  # acme's first block holds the only worker
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        backlog = []
        for _ in range(3):
            backlog.append(asyncio.create_task(_started_at(pool, workspaces, tenant="acme")))
            await asyncio.sleep(0.02)  # in this order
        await _queued(pool, 3)
        other = asyncio.create_task(_started_at(pool, workspaces, tenant="globex"))
        await _queued(pool, 4)
        starts = await asyncio.gather(first, *backlog, other)
    first_at, *backlog_at, other_at = starts
    assert first_at < other_at < min(backlog_at), starts
    assert backlog_at == sorted(backlog_at)  # a tenant's own blocks keep their order


async def test_one_tenant_alone_is_served_in_order(backend: Backend, workspaces: Path) -> None:
    async with started_pool(backend, workspaces, size=1) as pool:
        tasks = []
        for _ in range(4):
            tasks.append(asyncio.create_task(_started_at(pool, workspaces, tenant="acme")))
            await asyncio.sleep(0.02)
        starts = await asyncio.gather(*tasks)
    assert starts == sorted(starts)
    assert pool.workers.waiting == 0


async def test_a_block_whose_request_goes_away_leaves_the_line(backend: Backend, workspaces: Path) -> None:
    """The client of the block first in line goes away while it waits (its task is cancelled): it
    leaves the line, and the next block gets the worker when it is free, not never."""
    async with started_pool(backend, workspaces, size=1) as pool:
        first = asyncio.create_task(_started_at(pool, workspaces, tenant="acme"))
        deadline = time.monotonic() + 10
        while pool.workers.idle_workers:  # acme's block holds the only worker
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        gone = asyncio.create_task(_started_at(pool, workspaces, tenant="globex"))  # first in line
        await _queued(pool, 1)
        second = asyncio.create_task(_started_at(pool, workspaces, tenant="acme"))
        await _queued(pool, 2)
        gone.cancel()
        async with asyncio.timeout(20):
            first_at, second_at = await asyncio.gather(first, second)
        assert first_at < second_at
        assert gone.cancelled()
        assert pool.workers.waiting == 0
