"""Both lanes of a worker hear of a new job at once (app.kit.jobs.run_worker): a background turn
starts as soon as it is queued, not at the next poll for jobs. Both stores, with a real worker."""

from __future__ import annotations

import pytest

from app.kit import jobs
from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory
from tests.events.test_turn_events import wait_for_turn

# The workers' poll for jobs, made longer than the test waits: only a notification starts a turn.
NO_POLL_SECONDS = 60.0


async def test_an_idle_worker_starts_a_background_turn_when_told(
    make_client: AppFactory, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Background turns, one after another, each queued while the worker is idle: each starts on
    the notification of its job (wait_for_turn gives up after 20 s; the poll comes after 60).
    Before, on SQLite, the webhook lane's LISTEN replaced the turn lane's (the in-memory store keeps
    one listener), so a turn waited for the lane's next poll (0.3 to 0.5 s with the usual 0.5 s)."""
    monkeypatch.setattr(jobs, "EMBEDDED_POLL_SECONDS", NO_POLL_SECONDS)
    monkeypatch.setattr(jobs, "STORE_POLL_SECONDS", NO_POLL_SECONDS)
    llm.script("a", "b", "c")
    async with make_client() as client:
        for _ in range(3):
            created = await client.post("/v1/conversations", json={"input": "hi", "background": True})
            assert created.status_code == 202, created.text
            turn = await wait_for_turn(client, created.json()["conversation_id"], created.json()["turn_id"])
            assert turn["status"] == "completed", turn
