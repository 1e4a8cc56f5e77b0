"""Background turns share the job workers fairly between tenants: a tenant that queued many turns
waits behind another tenant's first, not the other way round (app.kit.jobs: a job's priority is
minus how many of its tenant's jobs wait or run). Both stores, over HTTP, with a real worker."""

from __future__ import annotations

import asyncio
import time

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.conversations import background
from app.llm.scripted import Reply, ScriptedLLM
from app.models import Turn
from tests.conftest import AppFactory
from tests.conversations.test_tenants import KEYS, bearer

ACME, GLOBEX = bearer("key-acme-123"), bearer("key-globex-456")


async def _background(client: httpx.AsyncClient, headers: dict[str, str]) -> str:
    body = {"input": "hi", "background": True}
    response = await client.post("/v1/conversations", json=body, headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["turn_id"])


async def _ended_in_order(client: httpx.AsyncClient, turn_ids: list[str], *, within: float) -> list[str]:
    """The turns' ids in the order they started, once all of them completed."""
    maker: async_sessionmaker[AsyncSession] = client.app.state.sessionmaker  # type: ignore[attr-defined]
    deadline = time.monotonic() + within
    while True:
        async with maker() as session:
            rows = list((await session.scalars(select(Turn).where(Turn.id.in_(turn_ids)))).all())
        if len(rows) == len(turn_ids) and all(row.status == "completed" for row in rows):
            return [row.id for row in sorted(rows, key=lambda row: (row.started_at, row.id))]
        assert time.monotonic() < deadline, [(row.id, row.status) for row in rows]
        await asyncio.sleep(0.05)


async def test_a_tenants_first_turn_runs_before_another_tenants_backlog(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    """One slot: acme's first turn runs (its model answers after a second), acme queues three
    more, then globex queues one. Globex's runs next; before, it ran after all of acme's."""
    llm.script(Reply(text="first", delay=1.0), "a", "b", "c", "d")
    async with make_client(api_keys=KEYS, worker_concurrency=1) as client:
        first = await _background(client, ACME)
        deadline = time.monotonic() + 10
        while not llm.requests:  # acme's first turn holds the slot
            assert time.monotonic() < deadline, "the first turn never reached the model"
            await asyncio.sleep(0.02)
        backlog = [await _background(client, ACME) for _ in range(3)]
        other = await _background(client, GLOBEX)
        order = await _ended_in_order(client, [first, *backlog, other], within=30)
    assert order == [first, other, *backlog]


async def test_the_recovery_sweep_leaves_a_waiting_turn_in_its_place(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    """A turn queued longer than SABRE_TURN_REQUEUE_SECONDS is handed out again by the sweep; one
    whose job still waits its turn keeps that job (before: a second job each sweep, which the
    fair share then counted against its tenant)."""
    llm.script(Reply(text="first", delay=1.5), "second")
    async with make_client(api_keys=KEYS, worker_concurrency=1, turn_requeue_seconds=0.05) as client:
        first = await _background(client, ACME)
        deadline = time.monotonic() + 10
        while not llm.requests:  # the first turn holds the only slot
            assert time.monotonic() < deadline, "the first turn never reached the model"
            await asyncio.sleep(0.02)
        waiting = await _background(client, ACME)
        await asyncio.sleep(0.1)  # queued longer than the requeue time
        resources = client.app.state.resources  # type: ignore[attr-defined]
        assert await background.recover_turns(resources) >= 1
        await background.recover_turns(resources)
        queued = await resources.jobs.job_manager.list_jobs_async(queue="turns", status="todo")
        assert [job.task_kwargs["turn_id"] for job in queued].count(waiting) == 1, queued
        order = await _ended_in_order(client, [first, waiting], within=30)
    assert order == [first, waiting]
