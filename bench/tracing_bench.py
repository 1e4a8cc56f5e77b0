"""What observability and tenant limits cost per request: tracing off and on, and the rate
limiter, against the floor of DESIGN §9, in one run on one machine (markdown tables).

Run: ``uv run python bench/tracing_bench.py [--quick]``.

Four servers run side by side on one fresh PostgreSQL database and the same Redis, and are measured
in interleaved rounds (the machines are noisy; ratios within a run hold):

- ``floor``: ``bench/floor_app.py`` (FastAPI + one PostgreSQL transaction per request);
- ``off``: ``sabre serve`` with the defaults: tracing off, no tenant limits (the access log and the
  request id are always on);
- ``traced``: the same with ``SABRE_TRACING_ENDPOINT`` set: every request, turn, iteration, model
  call, block, helper call and SQL statement is a span, batched to an OTLP/HTTP receiver in this
  process that reads and drops them;
- ``limited``: the same as ``off`` with ``SABRE_RATE_LIMIT``, ``SABRE_MAX_CONCURRENT_TURNS`` and
  ``SABRE_TOKEN_QUOTA`` set high enough never to refuse: every request pays the Redis round trip
  of the rate check, every turn those of the quota check, its place and its token count.

The workload is the DESIGN §9 pair (start a conversation whose block calls an external tool, the
turn pauses; resume with the result, the model answers) with the instant ScriptedLLM, plus a read
(``GET /v1/conversations/{id}``: auth, rate check, one SELECT). Figures: p50 latency per request,
the server process's CPU per request, and the difference to ``off``. Then, in this process, the
micro-costs: a span while tracing is off, and one rate check against Redis and in memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import secrets
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from app.kit.migrate import upgrade
from app.llm.scripted import ScriptedLLM
from bench.service_bench import (
    ADMIN_DSN,
    REDIS_URL,
    Bench,
    Responder,
    Server,
    clean_env,
    free_port,
    launch,
    ms,
    pct,
    ratio,
    table,
    wait_ready,
)

CONDITIONS = ("off", "traced", "limited")


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that reads each export and drops it (counting the bytes)."""

    received = 0

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _Sink.received += len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of one process (not its children: the sandbox workers)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def read(bench: Bench, client: httpx.AsyncClient, conversation: str) -> float:
    started = time.perf_counter()
    response = await client.get(f"{bench.sabre}/v1/conversations/{conversation}")
    if response.status_code != 200 and len(bench.errors) < 20:
        bench.errors.append(f"read: HTTP {response.status_code} {response.text[:200]}")
    return time.perf_counter() - started


async def measure(
    benches: dict[str, Bench], pids: dict[str, int], *, rounds: int, pairs: int
) -> dict[str, dict[str, Any]]:
    """Interleaved rounds of ``pairs`` conversations (and as many reads) per server."""
    results: dict[str, dict[str, Any]] = {
        name: {"start": [], "resume": [], "read": [], "cpu": 0.0, "requests": 0, "read_cpu": 0.0, "reads": 0}
        for name in benches
    }
    async with httpx.AsyncClient(timeout=120) as client:
        for name, bench in benches.items():  # warm-up: connections, the sandbox, code paths
            for _ in range(5):
                if name == "floor":
                    await bench.floor_conversation(client)
                else:
                    await bench.sabre_conversation(client)
        for _ in range(rounds):
            for name, bench in benches.items():
                before = cpu_of(pids[name])
                result = results[name]
                for _ in range(pairs):
                    if name == "floor":
                        pair = await bench.floor_conversation(client)
                        if pair:
                            result["start"].append(pair[0].latency)
                            result["resume"].append(pair[1].latency)
                            result["requests"] += 2
                        continue
                    sabre_pair = await bench.sabre_conversation(client)
                    if sabre_pair is None:
                        continue
                    created, resumed = sabre_pair
                    result["start"].append(created.overhead)
                    result["resume"].append(resumed.overhead)
                    result["requests"] += 2
                    result["conversation"] = created.body["conversation_id"]
                result["cpu"] += cpu_of(pids[name]) - before
                if name == "floor" or "conversation" not in result:
                    continue
                # Reads alone: auth, the rate check when limited, one SELECT (their own CPU account).
                before = cpu_of(pids[name])
                for _ in range(pairs * 2):
                    result["read"].append(await read(bench, client, result["conversation"]))
                result["read_cpu"] += cpu_of(pids[name]) - before
                result["reads"] += pairs * 2
    return results


async def micro(*, n: int) -> list[list[str]]:
    """In this process: a span with tracing off; one rate check against Redis and in memory."""
    from app.auth.limits import TenantLimiter
    from app.config import Settings
    from app.kit import tracing

    rows: list[list[str]] = []
    started = time.perf_counter()
    for _ in range(n * 10):
        with tracing.span("x", None):
            pass
    rows.append(["a span, tracing off", f"{(time.perf_counter() - started) / (n * 10) * 1e9:.0f} ns"])
    from redis.asyncio import Redis

    client = Redis.from_url(REDIS_URL)
    try:
        for _ in range(50):
            await client.get("sabre-bench-reference")
        started = time.perf_counter()
        for _ in range(n):
            await client.get("sabre-bench-reference")
        rows.append(
            [
                "one Redis GET (the round trip, for reference)",
                f"{(time.perf_counter() - started) / n * 1e6:.0f} µs",
            ]
        )
    finally:
        await client.aclose()
    for label, redis_url in (("Redis", REDIS_URL), ("in memory (no Redis)", None)):
        settings = Settings(rate_limit="100000000/minute", redis_url=redis_url)
        limiter = TenantLimiter(settings, redis=None)
        tenant = f"bench-{secrets.token_hex(4)}"
        for _ in range(50):
            await limiter.check_request(tenant)
        started = time.perf_counter()
        for _ in range(n):
            await limiter.check_request(tenant)
        rows.append([f"one rate check, {label}", f"{(time.perf_counter() - started) / n * 1e6:.0f} µs"])
    return rows


async def run(quick: bool, *, baseline_src: Path | None = None) -> None:
    rounds, pairs = (4, 10) if quick else (10, 25)
    name = f"sabre_bench_{secrets.token_hex(4)}"
    dsn = f"{ADMIN_DSN.rsplit('/', 1)[0]}/{name}"
    admin = await asyncpg.connect(ADMIN_DSN, timeout=5)
    servers: list[Server] = []
    responder = Responder()
    llm = ScriptedLLM(responder=responder)
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    tmp = tempfile.TemporaryDirectory(prefix="sabre_bench_")
    benches: dict[str, Bench] = {}
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        await upgrade("postgresql+asyncpg://" + dsn.split("://", 1)[1])
        llm.start()
        tmpdir = Path(tmp.name)
        base = {
            "SABRE_DATABASE_URL": dsn,
            "SABRE_REDIS_URL": REDIS_URL,
            "OPENAI_BASE_URL": llm.base_url,
            "OPENAI_API_KEY": "sk-bench",
            "SABRE_LLM_API": "chat",
            "SABRE_MODEL": "scripted-model",
            "SABRE_RUNTIME_WORKERS": "1",
            "SABRE_LOG_FORMAT": "json",
            "HOME": str(tmpdir),
        }
        extra = {
            "off": {},
            "traced": {"SABRE_TRACING_ENDPOINT": f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"},
            "limited": {
                "SABRE_RATE_LIMIT": "1000000/minute",
                "SABRE_MAX_CONCURRENT_TURNS": "1000",
                "SABRE_TOKEN_QUOTA": "1000000000000/day",
            },
        }
        env_clean = {k: v for k, v in clean_env().items() if not k.startswith("OTEL_")}
        conditions = list(CONDITIONS)
        if baseline_src is not None:
            # The service as it was before (e.g. `git archive <commit> app personas migrations`):
            # what the always-on parts (request id, access log, HTTP metrics) cost.
            conditions.insert(0, "before")
            extra["before"] = {"PYTHONPATH": str(baseline_src)}
        for condition in conditions:
            port = free_port()
            env = {**env_clean, **base, **extra[condition], "SABRE_DATA_DIR": str(tmpdir / condition)}
            argv = [sys.executable, "-m", "app.cli", "serve", "--port", str(port)]
            servers.append(launch(condition, argv, env, port, tmpdir))
        floor_port = free_port()
        floor_argv = [sys.executable, "-m", "uvicorn", "bench.floor_app:app", "--port", str(floor_port)]
        servers.append(
            launch(
                "floor",
                [*floor_argv, "--log-level", "warning"],
                clean_env(FLOOR_DATABASE_URL=dsn),
                floor_port,
                tmpdir,
            )
        )
        await asyncio.gather(*(wait_ready(s, within=120) for s in servers))
        for server in servers:
            benches[server.name] = Bench(
                llm=llm,
                responder=responder,
                sabre=server.url,
                floor=servers[-1].url,
                langgraph="",  # not measured here
                quick=quick,
                sabre_pid=server.process.pid,
                floor_pid=servers[-1].process.pid,
                langgraph_pid=0,
            )
        order = ["floor", *conditions]
        benches = {k: benches[k] for k in order}
        pids = {s.name: s.process.pid for s in servers}

        print(f"# Observability and tenant limits: cost per request{' (--quick)' if quick else ''}\n")
        print(
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
            f"PostgreSQL + Redis; {rounds} interleaved rounds of {pairs} conversations per server; "
            "SABRE latencies exclude the scripted model's own time."
        )
        results = await measure(benches, pids, rounds=rounds, pairs=pairs)
        floor = results["floor"]
        floor_p50 = pct(floor["start"] + floor["resume"], 50)
        off = results["off"]
        rows = []
        for key in order:
            result = results[key]
            cpu = result["cpu"] / max(1, result["requests"])
            start, resume = pct(result["start"], 50), pct(result["resume"], 50)
            reads = pct(result["read"], 50) if result["read"] else float("nan")
            rows.append(
                [
                    key,
                    ms(start),
                    ms(resume),
                    ms(reads) if reads == reads else "-",
                    ratio((start + resume) / 2, floor_p50),
                    "-" if key in ("floor", "off") else f"{(start - pct(off['start'], 50)) * 1000:+.2f}",
                    "-" if key in ("floor", "off") else f"{(resume - pct(off['resume'], 50)) * 1000:+.2f}",
                    "-"
                    if key in ("floor", "off") or not result["read"]
                    else f"{(reads - pct(off['read'], 50)) * 1000:+.2f}",
                    f"{cpu * 1000:.2f}",
                    "-" if not result["reads"] else f"{result['read_cpu'] / result['reads'] * 1000:.2f}",
                ]
            )
        table(
            "Per request (p50, ms)",
            [
                "server",
                "start",
                "resume",
                "read",
                "vs floor",
                "Δ start",
                "Δ resume",
                "Δ read",
                "CPU ms/req",
                "CPU ms/read",
            ],
            rows,
            notes=[
                f"Spans exported to the receiver: {_Sink.received / 1024:.0f} KiB. 'vs floor': mean of the "
                "start and resume p50 over the floor's p50. CPU: the server process only (not its sandbox "
                "workers): 'CPU ms/req' per start or resume (the floor: per request), 'CPU ms/read' per read."
            ],
        )
        table("In this process", ["what", "cost"], await micro(n=200 if quick else 2000))
        errors = [e for bench in benches.values() for e in bench.errors]
        if errors:
            print(f"\n**{len(errors)} unexpected response(s)**: {errors[:3]}")
    finally:
        for server in servers:
            server.stop()
        llm.stop()
        sink.shutdown()
        with contextlib.suppress(Exception):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        tmp.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="also measure the service from this source tree (a `git archive` of app, personas and "
        "migrations at an earlier commit), as 'before'",
    )
    args = parser.parse_args()
    baseline = args.baseline_src.resolve() if args.baseline_src else None
    asyncio.run(run(args.quick, baseline_src=baseline))


if __name__ == "__main__":
    main()
