"""Observability over HTTP: request ids (kept, made, refused when forged), the access log and a
turn's log lines under the request's id from every server process, OpenTelemetry spans sent to a
real OTLP/HTTP receiver, and who may read /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory
from tests.conversations.test_idempotency_lease import free_port

ROOT = Path(__file__).resolve().parents[2]
HEX32 = re.compile(r"[0-9a-f]{32}")


def block(code: str) -> str:
    return f"Let me work it out.\n<helpers>\n{code}\n</helpers>"


# -- request ids, in process --------------------------------------------------------------------


async def test_request_id_is_kept_made_or_replaced(make_client: AppFactory, llm: ScriptedLLM) -> None:
    async with make_client(api_keys="acme:key-acme") as client:
        kept = await client.get("/healthz", headers={"X-Request-ID": "trace-abc_123:4/5"})
        assert kept.headers["x-request-id"] == "trace-abc_123:4/5"
        made = await client.get("/healthz")
        assert HEX32.fullmatch(made.headers["x-request-id"])
        forged = [
            "x" * 129,  # oversized
            "",  # empty
            'abc" injected="1',  # quotes and spaces: would forge fields in a log line
            "abc\tdef",
            "ünïcode",
        ]
        for value in forged:
            response = await client.get("/healthz", headers={"X-Request-ID": value.encode()})  # type: ignore[dict-item]
            assert HEX32.fullmatch(response.headers["x-request-id"]), value
        # Errors carry it too: 401 from the auth dependency, 404 from routing, 422 from validation.
        for response in (
            await client.get("/v1/conversations", headers={"X-Request-ID": "e-401"}),
            await client.get("/nowhere", headers={"X-Request-ID": "e-404"}),
            await client.post(
                "/v1/conversations",
                json={"input": 5},
                headers={"X-Request-ID": "e-422", "Authorization": "Bearer key-acme"},
            ),
        ):
            assert response.headers["x-request-id"] == f"e-{response.status_code}"
            assert response.headers["content-type"] == "application/problem+json"
    assert llm.requests == []


async def test_cors_is_off_by_default_and_allows_configured_origins(make_client: AppFactory) -> None:
    preflight = {
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,idempotency-key",
    }
    async with make_client() as client:
        response = await client.options("/v1/conversations", headers=preflight)
        assert "access-control-allow-origin" not in response.headers
    async with make_client(cors_origins="https://app.example, https://other.example") as client:
        response = await client.options("/v1/conversations", headers=preflight)
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        assert "idempotency-key" in response.headers["access-control-allow-headers"].lower()
        refused = await client.options(
            "/v1/conversations", headers={**preflight, "Origin": "https://evil.example"}
        )
        assert refused.status_code == 400
        assert "access-control-allow-origin" not in refused.headers
        simple = await client.get("/v1/conversations", headers={"Origin": "https://other.example"})
        assert simple.headers["access-control-allow-origin"] == "https://other.example"
        assert "x-request-id" in simple.headers["access-control-expose-headers"].lower()


async def test_metrics_access(make_client: AppFactory, llm: ScriptedLLM) -> None:
    # A keyless loopback server shows them (tests/conversations/test_turns.py reads them so).
    async with make_client() as client:
        assert (await client.get("/metrics")).status_code == 200
    # With API keys and no metrics key: not on the API port.
    async with make_client(api_keys="acme:key-acme") as client:
        hidden = await client.get("/metrics", headers={"Authorization": "Bearer key-acme"})
        assert hidden.status_code == 404
        assert "SABRE_METRICS_KEY" in hidden.json()["detail"]
    async with make_client(api_keys="acme:key-acme", metrics_key="scrape-secret") as client:
        for headers in ({}, {"Authorization": "Bearer key-acme"}, {"Authorization": "Bearer scrape-secre"}):
            assert (await client.get("/metrics", headers=headers)).status_code == 401
        shown = await client.get("/metrics", headers={"Authorization": "Bearer scrape-secret"})
        assert shown.status_code == 200
        assert "sabre_http_requests_total" in shown.text
        # Route templates, never raw paths (ids would make every conversation a series).
        assert 'route="/metrics"' in shown.text
        assert "/nowhere" not in shown.text
    async with make_client(metrics_port=free_port()) as client:
        assert (await client.get("/metrics")).status_code == 404


# -- tracing: a real OTLP/HTTP receiver -----------------------------------------------------------


class _Receiver(BaseHTTPRequestHandler):
    spans: list[Any]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                self.server.spans.extend(scope.spans)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[Any]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.spans = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", server.spans  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


async def test_spans_are_exported_when_configured(
    make_client: AppFactory, llm: ScriptedLLM, store: dict[str, str | None]
) -> None:
    llm.script(block("up = llm_call(['hello'], 'Uppercase it')\nprint(up)"), "HELLO", "Done.", "Again.")
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with otlp_receiver() as (endpoint, spans):
        async with make_client(tracing_endpoint=endpoint) as client:
            response = await client.post(
                "/v1/conversations", json={"input": "shout"}, headers={"traceparent": traceparent}
            )
            assert response.json()["status"] == "completed", response.text
            url = f"/v1/conversations/{response.json()['conversation_id']}/messages"
            again = await client.post(url, json={"input": "again"})
            assert again.json()["output"] == "Again.", again.text
        # The lifespan's end flushed them.
    by_id = {span.span_id: span for span in spans}
    names = [span.name for span in spans]
    for expected in ("POST /v1/conversations", "turn", "iteration", "llm.call", "block", "helper"):
        assert expected in names, names
    assert any(name.startswith("store ") for name in names), names
    assert names.count("iteration") == 3  # the block, the answer; the message's answer

    def ancestors(span: Any) -> list[str]:
        chain = []
        while span.parent_span_id in by_id:
            span = by_id[span.parent_span_id]
            chain.append(span.name)
        return chain

    root = next(span for span in spans if span.name == "POST /v1/conversations")
    assert root.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"  # the caller's trace goes on
    # Background work (the recovery sweep, the job worker's polls) makes traces of its own.
    message = next(span for span in spans if span.name == "POST /v1/conversations/{conversation_id}/messages")
    requests = {root.trace_id, message.trace_id}  # the message came without a traceparent
    others = {span.name for span in spans if span.trace_id not in requests}
    assert others <= {name for name in names if name.startswith("store ")}, others
    assert all(span.trace_id in requests for span in spans if not span.name.startswith("store "))
    helper = next(span for span in spans if span.name == "helper")
    assert ancestors(helper)[:4] == ["block", "iteration", "turn", "POST /v1/conversations"]
    for call in (span for span in spans if span.name == "llm.call"):
        assert ancestors(call)[:2] in (["iteration", "turn"], ["helper", "block"])
    # A turn's phases around the loop (bench/turn_phases.py reads them): each request's own.
    for name, count in (("turn.prepare", 2), ("turn.persist", 2), ("turn.publish", 2), ("lock.acquire", 1)):
        phases = [span for span in spans if span.name == name]
        assert len(phases) == count, (name, names)
        assert {by_id[span.parent_span_id].name for span in phases} <= {root.name, message.name}, name
    lock = next(span for span in spans if span.name == "lock.release")
    assert by_id[lock.parent_span_id] is message


async def test_the_standard_otel_variables_turn_tracing_on_and_a_background_turn_continues_the_trace(
    make_client: AppFactory, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm.script("queued answer")
    traceparent = "00-1bf7651916cd43dd8448eb211c80319d-c7ad6b7169203332-01"
    with otlp_receiver() as (endpoint, spans):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        async with make_client() as client:
            queued = await client.post(
                "/v1/conversations",
                json={"input": "later", "background": True},
                headers={"traceparent": traceparent},
            )
            assert queued.status_code == 202, queued.text
            deadline = time.monotonic() + 60
            while (await client.get(queued.headers["location"])).json()["status"] in ("queued", "running"):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
    # The job ran the turn elsewhere (a job worker), inside the trace of the request that queued it.
    traced = {span.name for span in spans if span.trace_id.hex() == traceparent.split("-")[1]}
    assert {"POST /v1/conversations", "turn", "iteration", "llm.call"} <= traced, traced


async def test_otel_sdk_disabled_wins(make_client: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.kit import tracing

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    async with make_client():
        assert not tracing.enabled()


async def test_tracing_is_off_by_default(make_client: AppFactory, llm: ScriptedLLM) -> None:
    from app.kit import tracing

    llm.script("hi")
    async with make_client() as client:
        assert not tracing.enabled()
        assert tracing.span("x") is tracing.span("y")  # one shared no-op: nothing made per span
        assert (await client.post("/v1/conversations", json={"input": "hi"})).status_code == 201


# -- the same JSON logs from every process of `sabre serve --workers 2` ---------------------------


def text(log: Path) -> str:
    return log.read_text(errors="replace")


def tail(log: Path) -> str:
    return text(log)[-3000:]


@contextlib.asynccontextmanager
async def served(env: dict[str, str], log: Path) -> AsyncIterator[httpx.AsyncClient]:
    port = free_port()
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--workers",
            "2",
            env={**env, "SABRE_PORT": str(port)},
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            deadline = time.monotonic() + 90
            while True:
                assert process.returncode is None, tail(log)
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/healthz")).status_code == 200:
                        break
                assert time.monotonic() < deadline, tail(log)
                await asyncio.sleep(0.1)
            yield client
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 20)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def test_every_process_logs_json_lines_with_the_request_id(
    served_store: dict[str, str | None], llm: ScriptedLLM, tmp_path: Path
) -> None:
    """Two server processes; a waited, a streamed and a background turn (a job: on PostgreSQL
    through the job queue). Every line is one JSON object; the access log has the route template,
    status and tenant, and each turn's line its request's id."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SABRE_", "OTEL_"))},
        "SABRE_DATA_DIR": str(tmp_path / "data"),
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": "sk-test",
        "SABRE_LLM_API": "chat",
        "SABRE_MODEL": "scripted-model",
        "SABRE_RUNTIME_WORKERS": "1",
        "SABRE_RUNTIME_PRELOAD": "",
        "SABRE_API_KEYS": "acme:key-acme",
        "SABRE_METRICS_PORT": str(metrics_port := free_port()),
    }
    if served_store["redis_url"]:
        env["SABRE_DATABASE_URL"] = str(served_store["database_url"])
        env["SABRE_REDIS_URL"] = str(served_store["redis_url"])
    # else: an embedded store of its own in the data directory, not the file this process's tests use
    log = tmp_path / "serve.log"
    llm.script("one", "two", "three")
    auth = {"Authorization": "Bearer key-acme"}
    async with served(env, log) as client:
        waited = await client.post(
            "/v1/conversations", json={"input": "a"}, headers={**auth, "X-Request-ID": "req-waited"}
        )
        assert waited.status_code == 201, waited.text
        async with client.stream(
            "POST",
            "/v1/conversations",
            json={"input": "b", "stream": True},
            headers={**auth, "X-Request-ID": "req-stream"},
        ) as streamed:
            assert streamed.headers["x-request-id"] == "req-stream"
            _ = [line async for line in streamed.aiter_lines()]
        queued = await client.post(
            "/v1/conversations",
            json={"input": "c", "background": True},
            headers={**auth, "X-Request-ID": "req-background"},
        )
        assert queued.status_code == 202, queued.text
        turn_url = queued.headers["location"]
        deadline = time.monotonic() + 60
        while (await client.get(turn_url, headers=auth)).json()["status"] in ("queued", "running"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        # The turn's own line comes after its end is stored: wait for it rather than race it.
        deadline = time.monotonic() + 20
        while text(log).count('"turn_finished"') < 3 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        # Metrics on their own port, summed over both processes; not on the API port.
        assert (await client.get("/metrics", headers=auth)).status_code == 404
        scraped = (await client.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    records = []
    for line in lines:
        record = json.loads(line)  # every line, from either process, is JSON
        assert {"event", "level", "timestamp"} <= record.keys(), line
        records.append(record)
    started = [r for r in records if r["event"] == "sabre_started"]
    assert len(started) == 2, started  # both server processes
    access = [r for r in records if r["event"] == "request"]
    posted = {r["request_id"]: r for r in access if r["method"] == "POST"}
    assert posted["req-waited"]["path"] == "/v1/conversations"
    assert posted["req-waited"]["status"] == 201
    assert posted["req-waited"]["tenant"] == "acme"
    assert posted["req-background"]["status"] == 202
    finished = {r["request_id"]: r for r in records if r["event"] == "turn_finished"}
    assert set(finished) == {"req-waited", "req-stream", "req-background"}, finished
    assert all(r["outcome"] == "completed" and r["turn_id"].startswith("turn_") for r in finished.values())
    assert "key-acme" not in log.read_text()  # no secrets, no bodies
    turns = sum(
        float(line.rsplit(" ", 1)[1])
        for line in scraped.splitlines()
        if line.startswith("sabre_turns_total{") and 'outcome="completed"' in line
    )
    assert turns == 3, scraped
    posts = sum(
        float(line.rsplit(" ", 1)[1])
        for line in scraped.splitlines()
        if line.startswith("sabre_http_requests_total{") and 'method="POST"' in line
    )
    assert posts == 3, scraped


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
