"""Webhook deliveries have slots of their own and share them fairly between tenants: a receiver
that never answers holds a webhook slot, never a turn's, and a tenant with deliveries queued waits
behind another tenant's first (app.kit.jobs, app.events.webhooks). Both stores, real workers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from procrastinate.jobs import Job

from app.events.webhooks import SinkingRetry, WebhookDeliveryError, schedule_turn_webhook
from app.kit import jobs
from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory
from tests.events.test_turn_events import wait_for_turn
from tests.events.test_webhooks import TURN, resources_of
from tests.kit.test_jobs import eventually


@dataclass
class HeldReceiver:
    """A receiver on loopback that holds every request to ``/held…`` until ``release`` is set
    (at most 8 s, under the delivery timeout), and notes the paths in the order they arrived and
    in the order they were answered."""

    url: str = ""
    release: threading.Event = field(default_factory=threading.Event)
    paths: list[str] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)


@pytest.fixture
def held() -> Iterator[HeldReceiver]:
    state = HeldReceiver()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            with lock:
                state.paths.append(self.path)
            if self.path.startswith("/held"):
                state.release.wait(8)
            with lock:
                state.answered.append(self.path)
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


async def _schedule(client: httpx.AsyncClient, *, tenant: str, url: str, turn_id: str) -> None:
    await schedule_turn_webhook(
        resources_of(client),
        tenant=tenant,
        conversation_webhook_url=url,
        event_type="turn.completed",
        turn={**TURN, "turn_id": turn_id},
    )


async def _priorities(client: httpx.AsyncClient, held: HeldReceiver) -> dict[str, int]:
    """The priority of each of this test's webhook jobs, by path (the store keeps earlier tests'
    failed jobs)."""
    listed = await resources_of(client).jobs.job_manager.list_jobs_async(queue="webhooks")
    return {
        job.task_kwargs["url"].removeprefix(held.url): job.priority
        for job in listed
        if job.task_kwargs["url"].startswith(held.url)
    }


async def test_a_receiver_that_never_answers_holds_no_turns_slot(
    make_client: AppFactory, llm: ScriptedLLM, held: HeldReceiver
) -> None:
    """One slot of each kind: a delivery hangs on its receiver, and a background turn still runs
    at once (before, the delivery held the worker's only slot until its timeout)."""
    llm.script("done")
    async with make_client(webhook_allow="127.0.0.1", worker_concurrency=1, webhook_concurrency=1) as client:
        await _schedule(client, tenant="local", url=f"{held.url}/held", turn_id="turn_held")
        await eventually(lambda: held.paths == ["/held"], within=10, what="the delivery reached its receiver")
        created = await client.post("/v1/conversations", json={"input": "hi", "background": True})
        assert created.status_code == 202, created.text
        turn = await wait_for_turn(client, created.json()["conversation_id"], created.json()["turn_id"])
        assert turn["status"] == "completed", turn
        assert held.answered == []  # the delivery still hangs: the turn did not wait for it
        held.release.set()


async def test_a_tenants_first_webhook_goes_before_another_tenants_backlog(
    make_client: AppFactory, held: HeldReceiver
) -> None:
    """One webhook slot, held by acme's first delivery; acme queues three more, then globex one.
    Globex's is delivered next (before: after acme's three); each job's priority is minus its
    tenant's deliveries waiting or running when it was queued."""
    async with make_client(webhook_allow="127.0.0.1", webhook_concurrency=1) as client:
        await _schedule(client, tenant="acme", url=f"{held.url}/held/acme", turn_id="turn_a0")
        await eventually(lambda: held.paths == ["/held/acme"], within=10, what="acme's first delivery")
        for index in (1, 2, 3):
            await _schedule(client, tenant="acme", url=f"{held.url}/acme/{index}", turn_id=f"turn_a{index}")
        await _schedule(client, tenant="globex", url=f"{held.url}/globex", turn_id="turn_g")
        expected = {"/held/acme": 0, "/acme/1": -1, "/acme/2": -2, "/acme/3": -3, "/globex": 0}
        assert await _priorities(client, held) == expected
        held.release.set()
        await eventually(lambda: len(held.paths) == 5, within=15, what="every delivery arrived")
    assert held.paths == ["/held/acme", "/globex", "/acme/1", "/acme/2", "/acme/3"]


def _job(*, priority: int, attempts: int) -> Job:
    return Job(
        id=1,
        queue="webhooks",
        lock=None,
        queueing_lock=None,
        task_name="deliver_webhook",
        priority=priority,
        attempts=attempts,
        task_kwargs={},
    )


def test_a_retry_waits_behind_every_first_attempt_until_the_attempts_run_out() -> None:
    strategy = SinkingRetry(max_attempts=3, exponential_wait=2, retry_exceptions=[WebhookDeliveryError])
    failed = WebhookDeliveryError("HTTP 500")
    decision = strategy.get_retry_decision(exception=failed, job=_job(priority=-2, attempts=0))
    assert decision is not None
    assert decision.priority == jobs.RETRY_PRIORITY
    assert decision.retry_at is not None
    other = ValueError("not retried")
    assert strategy.get_retry_decision(exception=other, job=_job(priority=0, attempts=0)) is None
    assert strategy.get_retry_decision(exception=failed, job=_job(priority=0, attempts=3)) is None
