"""Webhooks end to end: the end of a turn POSTed to a receiver on loopback, verified with the
`standardwebhooks` library; retried after a 500; refused by the SSRF guard; delivered by the worker
inside `sabre serve` (SQLite) and by `sabre worker` (PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from app.events.webhooks import schedule_turn_webhook, tenant_secret, webhook_event
from app.llm.scripted import ScriptedLLM
from app.wiring import Resources, StartupError
from tests.conftest import AppFactory
from tests.conversations.test_stateless import _free_port, _ready
from tests.kit.test_jobs import ROOT, eventually, process, worker_env

TURN = {
    "conversation_id": "conv_x",
    "turn_id": "turn_x",
    "status": "completed",
    "output": "done",
    "version": 3,
}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: str


@dataclass
class Receiver:
    """A webhook receiver on loopback that answers the scripted statuses in turn (then 200)."""

    url: str
    statuses: list[int] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)

    def payload(self, index: int, secret: str) -> Any:
        """The ``index``-th request's body, verified with ``secret`` (raises if it does not verify)."""
        request = self.received[index]
        return Webhook(secret).verify(request.body, request.headers)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
            with lock:
                state.received.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                status = state.statuses.pop(0) if state.statuses else 200
            self.send_response(status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def resources_of(client: httpx.AsyncClient) -> Resources:
    return client.app.state.resources  # type: ignore[attr-defined, no-any-return]


async def secret_of(client: httpx.AsyncClient, tenant: str = "local") -> str:
    resources = resources_of(client)
    return await tenant_secret(resources.settings, sessionmaker=resources.sessionmaker, tenant=tenant)


async def test_the_end_of_a_turn_is_posted_signed(
    make_client: AppFactory, llm: ScriptedLLM, receiver: Receiver
) -> None:
    llm.script("All done.")
    async with make_client(webhook_allow="127.0.0.1") as client:
        response = await client.post(
            "/v1/conversations", json={"input": "hi", "webhook_url": f"{receiver.url}/hooks/sabre?k=1"}
        )
        assert response.status_code == 201, response.text
        turn = response.json()
        await eventually(lambda: len(receiver.received) == 1, within=15, what="the webhook arrived")
        secret = await secret_of(client)
        other_tenant = await secret_of(client, tenant="someone-else")
    request = receiver.received[0]
    assert request.path == "/hooks/sabre?k=1"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"].startswith("SABRE-Webhooks")
    payload = receiver.payload(0, secret)
    assert payload["type"] == "turn.completed"
    assert payload["data"] == turn
    assert payload["timestamp"].endswith("+00:00")
    assert request.headers["webhook-id"].startswith("whmsg_")
    # Each tenant signs with its own secret.
    assert secret.startswith("whsec_")
    assert other_tenant != secret
    with pytest.raises(WebhookVerificationError):
        receiver.payload(0, other_tenant)


async def test_a_500_is_retried_with_backoff_until_delivered(
    make_client: AppFactory, receiver: Receiver
) -> None:
    receiver.statuses = [500]
    async with make_client(webhook_allow="127.0.0.1") as client:
        await schedule_turn_webhook(
            resources_of(client),
            tenant="local",
            conversation_webhook_url=f"{receiver.url}/retry",
            event_type="turn.failed",
            turn=TURN,
        )
        await eventually(lambda: len(receiver.received) == 2, within=20, what="the retry arrived")
        secret = await secret_of(client)
    first, second = receiver.received
    # One message: the same id on every attempt (receivers drop duplicates by it), signed anew.
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert int(second.headers["webhook-timestamp"]) >= int(first.headers["webhook-timestamp"]) + 2
    assert receiver.payload(1, secret) == receiver.payload(0, secret)
    assert receiver.payload(1, secret)["type"] == "turn.failed"


async def test_the_tenant_default_is_used_when_the_conversation_names_none(
    make_client: AppFactory, receiver: Receiver
) -> None:
    async with make_client(
        webhook_allow="127.0.0.1", webhook_urls=f"local={receiver.url}/default, other=https://example.com/x"
    ) as client:
        resources = resources_of(client)
        for url in (None, f"{receiver.url}/own"):
            await schedule_turn_webhook(
                resources,
                tenant="local",
                conversation_webhook_url=url,
                event_type="turn.awaiting_tool_results",
                turn=TURN,
            )
        await schedule_turn_webhook(
            resources, tenant="nobody", conversation_webhook_url=None, event_type="turn.completed", turn=TURN
        )
        await eventually(lambda: len(receiver.received) == 2, within=15, what="both webhooks arrived")
        await asyncio.sleep(0.5)
    assert sorted(r.path for r in receiver.received) == ["/default", "/own"]


async def test_private_addresses_are_refused_at_delivery_and_not_retried(
    make_client: AppFactory, receiver: Receiver
) -> None:
    """The SSRF guard of the fetch helpers: without SABRE_WEBHOOK_ALLOW, loopback, link-local (the
    cloud metadata address) and a name that resolves to loopback are refused; the job fails after
    its one attempt and is not retried."""
    urls = [f"{receiver.url}/x", "http://169.254.169.254/latest/meta-data/", "http://localhost:9/x"]
    async with make_client() as client:
        resources = resources_of(client)
        for url in urls:
            await schedule_turn_webhook(
                resources,
                tenant="local",
                conversation_webhook_url=url,
                event_type="turn.completed",
                turn=TURN,
            )

        async def ours() -> list[Any]:
            jobs = await resources.jobs.job_manager.list_jobs_async(task="deliver_webhook")
            return [job for job in jobs if job.task_kwargs["url"] in urls]

        for _ in range(150):
            jobs = await ours()
            if len(jobs) == 3 and all(job.status == "failed" for job in jobs):
                break
            await asyncio.sleep(0.1)
        assert sorted((job.status, job.attempts) for job in jobs) == [("failed", 1)] * 3
        await asyncio.sleep(2.5)  # past the first backoff: still no retry
        assert [(job.status, job.attempts) for job in await ours()] == [("failed", 1)] * 3
    assert receiver.received == []


def test_event_types_of_turn_statuses() -> None:
    assert webhook_event("completed") == "turn.completed"
    assert webhook_event("awaiting_tool_results") == "turn.awaiting_tool_results"
    assert webhook_event("cancelled") == "turn.cancelled"
    with pytest.raises(ValueError, match="running"):
        webhook_event("running")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/hook", "http or https"),
        ("example.com/hook", "http or https"),
        ("http://user:secret@example.com/hook", "user name or password"),
        ("https://", "host"),
        ("https://example.com/" + "a" * 2040, "at most 2048"),
        ("http://exa mple.com/", "valid URL"),
    ],
)
async def test_a_bad_webhook_url_is_422(client: httpx.AsyncClient, url: str, message: str) -> None:
    response = await client.post("/v1/conversations", json={"input": "hi", "webhook_url": url})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert message in response.text


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"webhook_urls": "local"}, "expected tenant=url"),
        ({"webhook_urls": "local=ftp://x"}, "http or https"),
        ({"webhook_allow": "example.com"}, "not an IP address or CIDR range"),
    ],
)
async def test_bad_webhook_settings_stop_the_start(
    make_client: AppFactory, settings: dict[str, str], message: str
) -> None:
    with pytest.raises(StartupError, match=message):
        async with make_client(**settings):
            pass


def _cli_secret(env: dict[str, str], *, tenant: str) -> str:
    """What `sabre webhooks secret TENANT` prints."""
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "webhooks", "secret", tenant],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def _serve(env: dict[str, str], port: int, log: Path) -> Any:
    return process(["-m", "app.cli", "serve", "--port", str(port)], env=env, log=log)


async def test_sabre_serve_on_sqlite_delivers_with_its_own_worker(
    llm: ScriptedLLM, receiver: Receiver, tmp_path: Path
) -> None:
    """The embedded store's jobs run inside `sabre serve`; `sabre webhooks secret` prints the
    secret the receiver verifies with."""
    env = worker_env(database_url=None, llm=llm, tmp_path=tmp_path, SABRE_WEBHOOK_ALLOW="127.0.0.1")
    port, log = _free_port(), tmp_path / "serve.log"
    llm.script("Served.")
    with _serve(env, port, log):
        url = f"http://127.0.0.1:{port}"
        await _ready(url)
        async with httpx.AsyncClient() as http:
            response = await http.post(
                f"{url}/v1/conversations", json={"input": "hi", "webhook_url": f"{receiver.url}/embedded"}
            )
        assert response.status_code == 201, response.text
        await eventually(lambda: len(receiver.received) == 1, within=15, what="the webhook arrived", log=log)
    secret = await asyncio.to_thread(_cli_secret, env, tenant="local")
    payload = receiver.payload(0, secret)
    assert payload["type"] == "turn.completed"
    assert payload["data"] == response.json()


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_sabre_worker_delivers_what_the_api_scheduled(
    make_client: AppFactory, own_postgres_url: str, llm: ScriptedLLM, receiver: Receiver, tmp_path: Path
) -> None:
    """With SABRE_WORKER_IN_SERVE off the API only queues the webhook; `sabre worker` (another
    process, the same store, so the same tenant secret) delivers it, and stops cleanly on SIGTERM."""
    env = worker_env(
        database_url=own_postgres_url, llm=llm, tmp_path=tmp_path, SABRE_WEBHOOK_ALLOW="127.0.0.1"
    )
    log = tmp_path / "worker.log"
    llm.script("Queued for a worker.")
    async with make_client(
        worker_in_serve=False, webhook_allow="127.0.0.1", database_url=own_postgres_url
    ) as client:
        response = await client.post(
            "/v1/conversations", json={"input": "hi", "webhook_url": f"{receiver.url}/worker"}
        )
        assert response.status_code == 201, response.text
        await asyncio.sleep(1)
        assert receiver.received == []  # nobody runs jobs in the API process
        with process(["-m", "app.cli", "worker"], env=env, log=log) as worker:
            await eventually(
                lambda: len(receiver.received) == 1, within=30, what="the worker delivered", log=log
            )
            worker.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(worker.wait, 30) == 0
        secret = await secret_of(client)
    payload = receiver.payload(0, secret)
    assert payload["data"] == response.json()
    assert json.loads(receiver.received[0].body)["type"] == "turn.completed"
    assert "worker_stopped" in log.read_text()
