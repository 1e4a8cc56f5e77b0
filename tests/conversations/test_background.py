"""Background turns and the sweep for abandoned ones, when their process stops or their store fails:
the sweep stops even when a pass loses its cancellation (redis-py can drop one on Python 3.11:
app.kit.periodic), and a turn its runner gives up runs again at once, not after its lease."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.conversations import background
from app.conversations.repository import ConversationRepository
from app.kit.clock import utcnow
from app.llm.scripted import Reply, ScriptedLLM
from app.main import create_app
from app.models import Turn
from tests.conftest import AppFactory
from tests.events.test_turn_events import wait_for_turn


async def test_the_sweep_runs_at_start_and_stops_though_a_pass_loses_its_cancellation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes = 0
    lost = asyncio.Event()

    async def a_pass_that_loses_its_cancellation(resources: Any) -> int:
        nonlocal passes
        passes += 1
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            lost.set()  # returns as if the call had completed, as redis-py may
        return 0

    monkeypatch.setattr(background, "recover_turns", a_pass_that_loses_its_cancellation)

    async def serve() -> None:
        async with background.recovering(None, every=0.01):  # type: ignore[arg-type]
            await asyncio.sleep(0.05)

    task = asyncio.create_task(serve())
    done, _ = await asyncio.wait({task}, timeout=10)
    if not done:  # before: the body's exit waited for the sweep for ever
        task.cancel()
    assert done, "the sweep held its process's shutdown"
    assert passes == 1  # the first pass ran at start, and was still running at the exit
    assert lost.is_set()


async def test_a_turn_whose_worker_stops_midway_runs_again_at_once_on_the_next(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    """Its worker shuts down while the turn waits on the model: the turn is given up with its job,
    and the next server runs it at once (PostgreSQL: the job put back; SQLite: the recovery sweep
    at start), not once its lease (two minutes here) has run out."""
    llm.script(Reply(text="Never seen.", delay=30), "Done.")
    async with make_client(worker_shutdown_seconds=0.1) as first:
        created = await first.post("/v1/conversations", json={"input": "hi", "background": True})
        assert created.status_code == 202, created.text
        turn = created.json()
        deadline = time.monotonic() + 10
        while not llm.requests:
            assert time.monotonic() < deadline, "the turn never called the model"
            await asyncio.sleep(0.02)
    async with make_client() as second:
        started = time.monotonic()
        # Before: still running under the stopped worker's lease when this gave up (lease 120 s).
        done = await wait_for_turn(second, turn["conversation_id"], turn["turn_id"])
        assert done["status"] == "completed", done
        assert done["output"] == "Done."
        assert time.monotonic() - started < 15


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_turn_whose_store_fails_under_its_end_is_given_up_at_once(
    make_client: AppFactory, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection is lost under the turn's final write: its job fails, and the turn's lease
    lapses at once, so the next recovery sweep (every few seconds) runs it again, instead of the
    conversation answering 409 until the lease runs out."""
    llm.script("Done.")
    real_finish = ConversationRepository.finish

    async def lost(self: ConversationRepository, *args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(ConversationRepository, "finish", real_finish)
        raise DBAPIError(
            "UPDATE turns", {}, ConnectionResetError("connection reset"), connection_invalidated=True
        )

    monkeypatch.setattr(ConversationRepository, "finish", lost)
    async with make_client() as client:
        created = await client.post("/v1/conversations", json={"input": "hi", "background": True})
        assert created.status_code == 202, created.text
        turn_id = created.json()["turn_id"]
        maker: async_sessionmaker[AsyncSession] = client.app.state.sessionmaker  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while True:
            async with maker() as session:
                row = await session.get(Turn, turn_id)
            assert row is not None
            lapsed = row.lease_expires_at is not None and row.lease_expires_at <= utcnow()
            if row.status == "running" and lapsed:
                break  # given up (before: its lease ran for lock_lease_seconds, 120 s)
            assert row.status in ("queued", "running"), row.status
            assert time.monotonic() < deadline, "the turn was not given up"
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_new_test_runs_nothing_an_earlier_test_left_on_the_shared_store(
    make_client: AppFactory, llm: ScriptedLLM, store: dict[str, str | None], tmp_path: Path
) -> None:
    """Tests of one process share one database: a background turn an earlier test's app left when it
    closed (its job put back on the queue) must not run in this test's app, with this test's model."""
    with ScriptedLLM() as earlier_model:
        earlier_model.script(Reply(text="Never seen.", delay=30))
        earlier = create_app(
            Settings(
                database_url=store["database_url"],
                redis_url=store["redis_url"],
                data_dir=tmp_path / "earlier",
                openai_base_url=earlier_model.base_url,
                openai_api_key="sk-test-secret-key",
                llm_api="chat",
                model="scripted-model",
                runtime_workers=1,
                runtime_preload="",
                worker_shutdown_seconds=0.1,
            )
        )
        async with earlier.router.lifespan_context(earlier):
            transport = httpx.ASGITransport(app=earlier)
            async with httpx.AsyncClient(transport=transport, base_url="http://sabre.test") as client:
                created = await client.post("/v1/conversations", json={"input": "hi", "background": True})
                assert created.status_code == 202, created.text
                deadline = time.monotonic() + 10
                while not earlier_model.requests:
                    assert time.monotonic() < deadline, "the earlier turn never called its model"
                    await asyncio.sleep(0.02)
    llm.script("Mine.")
    async with make_client() as client:
        mine = await client.post("/v1/conversations", json={"input": "hello"})
        assert mine.status_code == 201, mine.text
        assert mine.json()["output"] == "Mine."
        await asyncio.sleep(1)  # the worker's first fetches and the recovery sweep at start
    # Before: the earlier turn ran here too (this model's second request, or its only one).
    assert len(llm.requests) == 1
