"""Chat Completions benchmark (issue 13): what ``POST /v1/chat/completions`` adds per request over the
native API on the same pause/resume workload; one run, one machine, markdown tables.

Run: ``uv run python bench/chat_completions_bench.py [--quick]``.

What it starts: a fresh PostgreSQL database (``sabre_bench_<hex>``, migrated, dropped at the end), a
ScriptedLLM in this process that answers instantly (``bench.service_bench.Responder``: the block of the
``[bench:work]`` scenario, then the answer once the block ran), and ``sabre serve`` on PostgreSQL +
Redis as its own process.

The workload is DESIGN §9's (start → the model's block calls an external tool → pause; resume with
the result → the block ends → the model answers), then more rounds on the same conversation (the next
user message → pause → resume → answer), driven two ways, interleaved conversation by conversation:

- **native**: ``POST /v1/conversations``, ``POST …/tool-results``, ``POST …/messages``;
- **chat**: ``POST /v1/chat/completions`` with the whole dialogue each time, as an OpenAI client sends
  it (the assistant message with its ``tool_calls``, then a ``tool`` message), so the service finds the
  conversation from the history's digest.

"overhead" is a request's latency minus the scripted model's own time during it. The difference
between the two faces on the same request is the endpoint's cost: parsing and digesting the history,
finding the link, shaping the answer, writing the next link. Nothing is asserted.

Environment: ``SABRE_BENCH_DATABASE_URL`` (admin DSN, default postgresql://postgres@127.0.0.1:5432/postgres)
and ``SABRE_BENCH_REDIS_URL`` (default redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from app.kit.migrate import upgrade
from app.llm.scripted import ScriptedLLM
from bench.service_bench import (
    ADMIN_DSN,
    GET_ORDER,
    Responder,
    Server,
    free_port,
    launch,
    ms,
    pct,
    ratio,
    sabre_env,
    table,
    wait_ready,
)

CHAT_TOOL = GET_ORDER  # already in the Chat Completions shape
Kind = tuple[str, str]  # (face, request): ("native" | "chat", "start" | "resume" | "message")


@dataclass
class Sample:
    latency: float
    llm: float

    @property
    def overhead(self) -> float:
        return self.latency - self.llm


@dataclass
class Run:
    llm: ScriptedLLM
    responder: Responder
    url: str
    samples: dict[Kind, list[Sample]] = field(default_factory=dict)
    by_round: dict[tuple[str, int], list[Sample]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def llm_time(self) -> float:
        return self.llm.time_spent + self.responder.spent

    async def post(
        self,
        client: httpx.AsyncClient,
        path: str,
        body: dict[str, Any],
        *,
        kind: Kind,
        round_: int,
        record: bool,
    ) -> dict[str, Any]:
        before = self.llm_time()
        started = time.perf_counter()
        response = await client.post(f"{self.url}{path}", json=body)
        sample = Sample(time.perf_counter() - started, self.llm_time() - before)
        if not response.is_success:
            if len(self.errors) < 20:
                self.errors.append(f"{kind}: HTTP {response.status_code} {response.text[:300]}")
            raise RuntimeError(response.text)
        if record:
            self.samples.setdefault(kind, []).append(sample)
            self.by_round.setdefault((kind[0], round_), []).append(sample)
        return response.json()  # type: ignore[no-any-return]

    async def native(self, client: httpx.AsyncClient, *, rounds: int, record: bool) -> None:
        turn = await self.post(
            client,
            "/v1/conversations",
            {"input": "[bench:work] please", "tools": [GET_ORDER]},
            kind=("native", "start"),
            round_=1,
            record=record,
        )
        conversation = turn["conversation_id"]
        for round_ in range(1, rounds + 1):
            if round_ > 1:
                turn = await self.post(
                    client,
                    f"/v1/conversations/{conversation}/messages",
                    {"input": "and again"},
                    kind=("native", "message"),
                    round_=round_,
                    record=record,
                )
            [call] = turn["pending_tool_calls"]
            done = await self.post(
                client,
                f"/v1/conversations/{conversation}/tool-results",
                {"results": [{"tool_call_id": call["id"], "output": {"status": "shipped"}}]},
                kind=("native", "resume"),
                round_=round_,
                record=record,
            )
            if done["status"] != "completed":
                raise RuntimeError(f"native: {done['status']}")

    async def chat(self, client: httpx.AsyncClient, *, rounds: int, record: bool) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "[bench:work] please"}]
        for round_ in range(1, rounds + 1):
            if round_ > 1:
                messages.append({"role": "user", "content": "and again"})
            paused = await self.post(
                client,
                "/v1/chat/completions",
                {"model": "sabre/default", "messages": messages, "tools": [CHAT_TOOL]},
                kind=("chat", "start" if round_ == 1 else "message"),
                round_=round_,
                record=record,
            )
            message = paused["choices"][0]["message"]
            messages.append(message)
            for call in message["tool_calls"]:
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"status": "shipped"})}
                )
            done = await self.post(
                client,
                "/v1/chat/completions",
                {"model": "sabre/default", "messages": messages, "tools": [CHAT_TOOL]},
                kind=("chat", "resume"),
                round_=round_,
                record=record,
            )
            if done["choices"][0]["finish_reason"] != "stop":
                raise RuntimeError(f"chat: {done['choices'][0]['finish_reason']}")
            messages.append(done["choices"][0]["message"])


async def run(quick: bool, *, runtime_workers: int) -> None:
    conversations = 15 if quick else 60
    rounds = 4 if quick else 10
    name = f"sabre_bench_{secrets.token_hex(4)}"
    dsn = f"{ADMIN_DSN.rsplit('/', 1)[0]}/{name}"
    admin = await asyncpg.connect(ADMIN_DSN, timeout=5)
    responder = Responder()
    llm = ScriptedLLM(responder=responder)
    tmp = tempfile.TemporaryDirectory(prefix="sabre_bench_")
    server: Server | None = None
    bench: Run | None = None
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        await upgrade("postgresql+asyncpg://" + dsn.split("://", 1)[1])
        llm.start()
        tmpdir = Path(tmp.name)
        port = free_port()
        env = sabre_env(
            dsn=dsn,
            llm=llm,
            data_dir=tmpdir / "data",
            SABRE_RUNTIME_WORKERS=str(runtime_workers),
            HOME=str(tmpdir),
        )
        server = launch(
            "sabre", [sys.executable, "-m", "app.cli", "serve", "--port", str(port)], env, port, tmpdir
        )
        await wait_ready(server)
        bench = Run(llm=llm, responder=responder, url=server.url)
        print(f"# SABRE Chat Completions benchmark{' (--quick)' if quick else ''}\n")
        print(
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
            f"`sabre serve` on PostgreSQL + Redis, {runtime_workers} sandbox workers; {conversations} "
            f"conversations per face of {rounds} rounds (each round: a request that pauses, then the "
            "resume), interleaved."
        )
        async with httpx.AsyncClient(timeout=120) as client:
            for _ in range(3):  # warm-up, not recorded
                await bench.native(client, rounds=2, record=False)
                await bench.chat(client, rounds=2, record=False)
            for _ in range(conversations):
                await bench.native(client, rounds=rounds, record=True)
                await bench.chat(client, rounds=rounds, record=True)
        report(bench, rounds=rounds)
    finally:
        if server is not None:
            server.stop()
            if bench is not None and bench.errors:
                print(f"\nerrors: {bench.errors[:5]}\n{server.log_tail(20)}")
        llm.stop()
        with contextlib.suppress(Exception):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        tmp.cleanup()


def report(bench: Run, *, rounds: int) -> None:
    rows = []
    for request in ("start", "resume", "message"):
        native = bench.samples.get(("native", request), [])
        chat = bench.samples.get(("chat", request), [])
        if not native or not chat:
            continue
        n50, c50 = pct([s.latency for s in native], 50), pct([s.latency for s in chat], 50)
        no50, co50 = pct([s.overhead for s in native], 50), pct([s.overhead for s in chat], 50)
        rows.append(
            [
                request,
                f"{len(native)} / {len(chat)}",
                ms(n50),
                ms(c50),
                ms(pct([s.latency for s in native], 95)),
                ms(pct([s.latency for s in chat], 95)),
                ms(co50 - no50),
                ratio(c50, n50),
            ]
        )
    every_native = [s for (face, _), v in bench.samples.items() if face == "native" for s in v]
    every_chat = [s for (face, _), v in bench.samples.items() if face == "chat" for s in v]
    n50, c50 = pct([s.latency for s in every_native], 50), pct([s.latency for s in every_chat], 50)
    rows.append(
        [
            "every request",
            f"{len(every_native)} / {len(every_chat)}",
            ms(n50),
            ms(c50),
            ms(pct([s.latency for s in every_native], 95)),
            ms(pct([s.latency for s in every_chat], 95)),
            ms(pct([s.overhead for s in every_chat], 50) - pct([s.overhead for s in every_native], 50)),
            ratio(c50, n50),
        ]
    )
    table(
        "Per request: native API against Chat Completions",
        ["request", "n native / chat", "native p50 ms", "chat p50 ms", "native p95", "chat p95",
         "chat - native overhead p50 ms", "chat / native p50"],
        rows,
    )  # fmt: skip
    rows = []
    for round_ in (1, rounds // 2 or 1, rounds):
        native = bench.by_round.get(("native", round_), [])
        chat = bench.by_round.get(("chat", round_), [])
        if native and chat:
            n50, c50 = pct([s.latency for s in native], 50), pct([s.latency for s in chat], 50)
            rows.append([str(round_), str(4 * round_ - 1), ms(n50), ms(c50), ms(c50 - n50)])
    table(
        "As the dialogue grows (a chat request resends it whole)",
        ["round", "messages in the last chat request", "native p50 ms", "chat p50 ms", "chat - native ms"],
        rows,
        [f"Scripted model: {len(bench.llm.requests)} requests, {bench.llm_time():.2f} s of its own time."],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer conversations and rounds")
    parser.add_argument("--runtime-workers", type=int, default=2, help="SABRE_RUNTIME_WORKERS of the server")
    args = parser.parse_args()
    asyncio.run(run(args.quick, runtime_workers=args.runtime_workers))


if __name__ == "__main__":
    main()
