"""Both lanes of a worker hear of a new job at once (app.kit.jobs.run_worker): a background turn
starts as soon as it is queued, not at the next poll for jobs. Both stores, with a real worker."""

from __future__ import annotations

import asyncio
import time

from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory
from tests.events.test_turn_events import wait_for_turn

# Well under the embedded store's poll for jobs (0.5 s), well over a turn's start on an idle worker.
AT_ONCE_SECONDS = 0.25


async def _reaches_the_model(llm: ScriptedLLM, *, seen: int) -> None:
    deadline = time.monotonic() + 5
    while True:
        if len(llm.requests) > seen:
            return
        assert time.monotonic() < deadline, "the turn never reached the model"
        await asyncio.sleep(0.005)


async def test_an_idle_worker_starts_a_background_turn_at_once(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    """Four background turns, one after another, each queued a moment after the worker went idle:
    each after the first (which also warms the server up) reaches the model at once. Before, on
    SQLite, the webhook lane's LISTEN replaced the turn lane's (the in-memory store keeps one
    listener), so each turn waited for the lane's next poll, 0.3 to 0.5 s."""
    llm.script("a", "b", "c", "d")
    async with make_client() as client:
        waits = []
        for _ in range(4):
            await asyncio.sleep(0.1)
            seen = len(llm.requests)
            started = time.monotonic()
            created = await client.post("/v1/conversations", json={"input": "hi", "background": True})
            assert created.status_code == 202, created.text
            await _reaches_the_model(llm, seen=seen)
            waits.append(time.monotonic() - started)
            turn = await wait_for_turn(client, created.json()["conversation_id"], created.json()["turn_id"])
            assert turn["status"] == "completed", turn
    assert max(waits[1:]) < AT_ONCE_SECONDS, waits
