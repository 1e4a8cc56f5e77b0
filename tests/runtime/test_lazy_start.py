"""A lazy pool (``RuntimePool(lazy=True)``, ``SABRE_RUNTIME_LAZY_START``): ``start`` chooses the
sandbox but forks no worker; the first block starts them, once however many blocks come at once,
and a pool closed before any block never forks one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.runtime.isolation import Backend
from tests.runtime.support import BACKENDS, conversation, run, started_pool

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.parametrize("backend", BACKENDS)]


async def test_no_worker_until_the_first_block(backend: Backend, workspaces: Path) -> None:
    async with started_pool(backend, workspaces, size=2, lazy=True) as pool:
        assert pool.sandbox == backend  # chosen (and probed) at start
        assert pool.workers.zygotes == []
        assert pool.idle_workers == 0
        outcome = await run(pool, "print(6 * 7)", workdir=conversation(workspaces))
        assert (outcome.status, outcome.stdout) == ("ok", "42\n"), outcome.error
        assert len(pool.workers.zygotes) == 1
        again = await run(pool, "print('again')", workdir=conversation(workspaces))
        assert again.status == "ok", again.error
        assert len(pool.workers.zygotes) == 1


async def test_blocks_that_come_together_start_the_workers_once(backend: Backend, workspaces: Path) -> None:
    async with started_pool(backend, workspaces, size=2, lazy=True) as pool:
        outcomes = await asyncio.gather(
            *(run(pool, f"print({i})", workdir=conversation(workspaces)) for i in range(4))
        )
        assert [o.stdout for o in outcomes] == [f"{i}\n" for i in range(4)], [o.error for o in outcomes]
        assert len(pool.workers.zygotes) == 1
        assert len(pool.workers.workers) == 2  # the pool's size: none started twice


async def test_a_pool_closed_before_any_block_forked_nothing(backend: Backend, workspaces: Path) -> None:
    async with started_pool(backend, workspaces, size=2, lazy=True) as pool:
        pass
    assert pool.workers.zygotes == []
    assert pool.workers.workers == set()
    with pytest.raises(RuntimeError, match="closed"):
        await run(pool, "print(1)", workdir=conversation(workspaces))
