"""Where a SABRE start and resume of the DESIGN §9 workload spend their wall time, read from the
service's own trace spans: one table per request kind, its phases as p50 milliseconds.

Run: ``uv run python bench/turn_phases.py [--conversations N]``.

It starts a fresh PostgreSQL database (migrated, dropped at the end), the scripted model of
``bench/service_bench.py`` and one ``sabre serve`` on PostgreSQL + Redis with
``SABRE_TRACING_ENDPOINT`` pointing at an OTLP/HTTP receiver in this process, then runs the §9
conversations one after another (start → the block calls an external tool → pause; resume → the
model answers). Each request's spans are summed per path below its root (``turn.prepare``: the
checks under the lock, the history, the turn stored as running; ``turn > iteration > llm.call``;
``turn.persist``: the outcome's transaction; ``lock.*``; ``turn.publish``: events to watchers and
the webhook; every SQL statement by verb), and ``(in no child span)`` rows give a span's own time:
for the request itself that is HTTP, auth, reading the conversation and the response.

Tracing costs a little per span (``bench/tracing_bench.py`` measures it), so absolute figures are
somewhat higher than untraced requests; read the shares. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import secrets
import statistics
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.kit.migrate import upgrade
from app.llm.scripted import ScriptedLLM
from bench.service_bench import (
    ADMIN_DSN,
    Bench,
    Responder,
    free_port,
    launch,
    sabre_env,
    table,
    wait_ready,
)

WARM_UP = 20
KINDS = {"POST /v1/conversations": "start", "POST /v1/conversations/{conversation_id}/tool-results": "resume"}


@dataclass(frozen=True, slots=True)
class Span:
    trace: bytes
    span: bytes
    parent: bytes
    name: str
    start: int  # ns
    end: int

    @property
    def ms(self) -> float:
        return (self.end - self.start) / 1e6


class Receiver:
    """An OTLP/HTTP trace receiver on loopback that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                spans = [
                    Span(
                        s.trace_id,
                        s.span_id,
                        s.parent_span_id,
                        s.name,
                        s.start_time_unix_nano,
                        s.end_time_unix_nano,
                    )
                    for resource in request.resource_spans
                    for scope in resource.scope_spans
                    for s in scope.spans
                ]
                with receiver._lock:
                    receiver.spans.extend(spans)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def take(self) -> list[Span]:
        with self._lock:
            spans, self.spans = self.spans, []
        return spans

    def close(self) -> None:
        self._server.shutdown()


def covered(spans: Sequence[Span]) -> int:
    """Nanoseconds covered by the union of the spans' intervals."""
    total, end = 0, None
    for span in sorted(spans, key=lambda s: s.start):
        if end is None or span.start > end:
            total += span.end - span.start
            end = span.end
        elif span.end > end:
            total += span.end - end
            end = span.end
    return total


OWN = "(in no child span)"
Path_ = tuple[str, ...]


def _name(span: Span) -> str:
    """Statements by verb only (``store SELECT``), other spans by name."""
    return " ".join(span.name.split(" ")[:2]) if span.name.startswith("store ") else span.name


def profile(trace: Sequence[Span], order: dict[Path_, int]) -> tuple[str, dict[Path_, list[float]]] | None:
    """The request kind and, per span path below its root (names from the root down), the summed
    ms and the count of spans there; ``OWN`` rows hold a span's time in none of its children.
    ``order`` numbers the paths in the order they first start (the table's row order)."""
    roots = [s for s in trace if not s.parent]
    if len(roots) != 1 or roots[0].name not in KINDS:
        return None
    children: dict[bytes, list[Span]] = collections.defaultdict(list)
    for span in trace:
        children[span.parent].append(span)
    totals: dict[Path_, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])

    def walk(span: Span, path: Path_) -> None:
        kids = sorted(children.get(span.span, []), key=lambda s: s.start)
        for kid in kids:
            below = (*path, _name(kid))
            order.setdefault(below, len(order))
            totals[below][0] += kid.ms
            totals[below][1] += 1
            walk(kid, below)
        if kids:
            own = (*path, OWN)
            order.setdefault(own, 1 << 30)
            totals[own][0] += span.ms - covered(kids) / 1e6

    root = roots[0]
    totals[()] = [root.ms, 1]
    walk(root, ())
    return KINDS[root.name], totals


def report(kind: str, samples: list[dict[Path_, list[float]]], order: dict[Path_, int]) -> None:
    paths = {path for sample in samples for path in sample if path}

    def key(path: Path_) -> tuple[int, ...]:
        return tuple(order.get(path[: i + 1], 1 << 30) for i in range(len(path)))

    request = statistics.median(sample[()][0] for sample in samples)
    rows = [["the request (its root span)", f"{request:.2f}", "100%", ""]]
    for path in sorted(paths, key=key):
        ms = statistics.median(sample.get(path, [0.0, 0.0])[0] for sample in samples)
        count = statistics.median(sample.get(path, [0.0, 0.0])[1] for sample in samples)
        label = " > ".join(path)
        rows.append([label, f"{ms:.2f}", f"{ms / request * 100:.0f}%", f"{count:g}" if count else ""])
    table(f"{kind}: {len(samples)} requests", ["span path", "p50 ms", "of the request", "spans"], rows)


async def run(conversations: int) -> None:
    receiver = Receiver()
    name = f"sabre_phases_{secrets.token_hex(4)}"
    base = ADMIN_DSN.rsplit("/", 1)[0]
    dsn = f"{base}/{name}"
    admin = await asyncpg.connect(ADMIN_DSN, timeout=5)
    responder = Responder()
    llm = ScriptedLLM(responder=responder)
    tmp = tempfile.TemporaryDirectory(prefix="sabre_phases_")
    server = None
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        await upgrade("postgresql+asyncpg://" + dsn.split("://", 1)[1])
        llm.start()
        port = free_port()
        env = sabre_env(
            dsn=dsn,
            llm=llm,
            data_dir=Path(tmp.name) / "data",
            SABRE_TRACING_ENDPOINT=receiver.url,
            HOME=tmp.name,
        )
        argv = [sys.executable, "-m", "app.cli", "serve", "--port", str(port)]
        server = launch("sabre", argv, env, port, Path(tmp.name))
        await wait_ready(server)
        bench = Bench(
            llm=llm,
            responder=responder,
            sabre=server.url,
            floor="",
            langgraph="",
            quick=False,
            sabre_pid=server.process.pid,
            floor_pid=0,
            langgraph_pid=0,
        )
        async with httpx.AsyncClient(timeout=60) as client:
            for _ in range(WARM_UP):
                await bench.sabre_conversation(client)
            await asyncio.sleep(6)  # the batch processor's last export of the warm-up
            receiver.take()
            for _ in range(conversations):
                await bench.sabre_conversation(client)
        await asyncio.sleep(6)
        if bench.errors:
            print("errors:", *bench.errors[:5], sep="\n  ")
    finally:
        if server is not None:
            server.stop()
        llm.stop()
        receiver.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        tmp.cleanup()
    traces: dict[bytes, list[Span]] = collections.defaultdict(list)
    for span in receiver.take():
        traces[span.trace].append(span)
    by_kind: dict[str, list[dict[Path_, list[float]]]] = collections.defaultdict(list)
    order: dict[Path_, int] = {}
    for trace in sorted(traces.values(), key=lambda spans: min(s.start for s in spans)):
        found = profile(trace, order)
        if found is not None:
            by_kind[found[0]].append(found[1])
    print(
        "## Where a §9 request's time goes "
        f"(sabre serve, PostgreSQL + Redis, traced; {conversations} conversations)\n"
    )
    for kind in ("start", "resume"):
        if by_kind.get(kind):
            report(kind, by_kind[kind], order)
    print(
        "\nSpan times are summed per request and path (3 SELECTs at one place are one row), the p50 "
        "taken per row, so rows need not add up. 'llm.call' includes the scripted model's own time; "
        "'store X' is the statement on the wire (a transaction's BEGIN is in its first statement; "
        "COMMIT is no span: it is in its parent's own time)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(run(args.conversations))


if __name__ == "__main__":
    main()
