"""SABRE service benchmark: turn overhead, snapshot size, pause/resume cost, and the DESIGN §9 workload
on SABRE, the LangGraph build and the floor side by side, all in one run on one machine, as markdown.

Run (the LangGraph build needs the ``bench`` dependency group)::

    uv run --group bench python bench/service_bench.py                  # everything, a few minutes
    uv run --group bench python bench/service_bench.py --quick          # fewer samples, shorter load
    uv run --group bench python bench/service_bench.py --workload-only  # only the §9 comparison

What it starts: two fresh PostgreSQL databases (``sabre_bench_<hex>``, migrated, for SABRE and the
floor; ``sabre_bench_lg_<hex>`` for LangGraph's checkpointer; both dropped at the end), one scripted
OpenAI-compatible model inside this process that answers instantly (its replies are chosen by a
responder from a scenario tag in the conversation's first user message; a ``Reply`` with
``tool_calls`` answers with Chat Completions tool calls, as the LangGraph build's model asks), and three
servers, each in its own process with the same number of server processes (``--web-workers``, default
1) and uvicorn's auto loop:

- SABRE: ``python -m app.cli serve``, PostgreSQL + Redis, ``--runtime-workers`` sandbox workers (2);
- the LangGraph build (``bench/langgraph_app.py``): FastAPI + a LangGraph ``StateGraph`` whose external
  tool pauses the run with ``interrupt()`` and resumes with ``Command(resume=...)``, state in
  ``AsyncPostgresSaver`` on one psycopg pool: what a user would build instead of SABRE;
- the floor (``bench/floor_app.py``): FastAPI + one PostgreSQL transaction per request.

The §9 workload: start a conversation → the model asks for an external tool → the turn pauses and the
response carries the call → resume with the tool's result → the model answers. Section 5 runs it on
the three targets (sequential, then 8 concurrent clients, with the CPU each used); section 6 prints
them side by side with ratios and issue 12's goals (``--json PATH`` also writes those figures), and
6b the CPU per conversation that the throughput goal leaves SABRE's server and sandboxes here.
Nothing is asserted: the machines are noisy, so read ratios measured in the same run.

"LLM time" is the scripted model's own ``time_spent`` during a request; "overhead" is the request's
latency minus that, i.e. what the service adds. The model, the HTTP clients and the servers share the
machine's cores, so absolute figures are pessimistic.

Environment: ``SABRE_BENCH_DATABASE_URL`` (admin DSN, default postgresql://postgres@127.0.0.1:5432/postgres)
and ``SABRE_BENCH_REDIS_URL`` (default redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import pickle
import platform
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import numpy as np

from app.kit.migrate import upgrade
from app.llm.scripted import RecordedRequest, Reply, ScriptedLLM, ScriptedToolCall

ROOT = Path(__file__).resolve().parents[1]
ADMIN_DSN = os.environ.get("SABRE_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("SABRE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

# Issue 12's goals on the DESIGN §9 workload, measured against the peers in the same run.
GOAL_VS_LANGGRAPH_P50 = 0.5
GOAL_VS_FLOOR_P50 = 3.0
GOAL_VS_LANGGRAPH_RATE = 3.0

ANSWER = "All done."
GET_ORDER = {
    "type": "function",
    "function": {
        "name": "get_order_details",
        "description": "Get the status of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}
TURN_BLOCK = "x = 1\nprint(x)"
DF_BLOCK = (
    "import pandas as pd, numpy as np\n"
    'df = pd.DataFrame({"a": np.arange(1000), "b": np.random.rand(1000), '
    '"c": [f"row{i}" for i in range(1000)]})\n'
    "print(df.shape)"
)
WORK_BLOCK = 'order = get_order_details(order_id="1")\nprint(order["status"])'
# The same request, the way the LangGraph build's model asks for it (a Chat Completions tool call).
WORK_CALL = Reply(tool_calls=[ScriptedToolCall(name="get_order_details", arguments={"order_id": "1"})])


def loop_block(calls: int) -> str:
    """A block that calls the external tool ``calls`` times in a loop."""
    return (
        f"total = 0\nfor i in range({calls}):\n"
        "    total += get_order_details(order_id=str(i))['n']\nprint('total', total)"
    )


TAG = re.compile(r"\[bench:(\w+)(?::(\d+))?\]")


class Responder:
    """Answer after a block ran (or a tool result came); otherwise send the scenario's block or tool call.

    The scenario is the ``[bench:NAME(:K)]`` tag in the first user message, so the bench keeps no
    per-conversation state and concurrent conversations cannot mix up their replies. ScriptedLLM
    starts its ``time_spent`` clock after the responder returns, so the responder keeps its own
    clock (``spent``), which the bench adds to the model's time.
    """

    def __init__(self) -> None:
        self.spent = 0.0
        self._lock = threading.Lock()

    def __call__(self, request: RecordedRequest) -> str | Reply:
        started = time.perf_counter()
        try:
            return self._reply(request)
        finally:
            elapsed = time.perf_counter() - started
            with self._lock:
                self.spent += elapsed

    @staticmethod
    def _user_texts(request: RecordedRequest) -> tuple[str, str]:
        """(first, last) user message text, read straight from a chat body (cheap on long histories)."""
        messages = request.body.get("messages")
        if isinstance(messages, list):
            users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
            if users and isinstance(users[0], str) and isinstance(users[-1], str):
                return users[0], users[-1]
        texts = [m.text for m in request.messages if m.role == "user"]
        return (texts[0], texts[-1]) if texts else ("", "")

    def _reply(self, request: RecordedRequest) -> str | Reply:
        messages = request.body.get("messages")
        if isinstance(messages, list) and messages and messages[-1].get("role") == "tool":
            return ANSWER  # the LangGraph build sent the tool's result
        first, last = self._user_texts(request)
        if "<helpers_result>" in last:
            return ANSWER
        match = TAG.search(first)
        if match is None:
            return ANSWER
        name, k = match.group(1), match.group(2)
        if name == "call":
            return WORK_CALL
        code = {
            "turn": TURN_BLOCK,
            "df": DF_BLOCK,
            "work": WORK_BLOCK,
            "loop": loop_block(int(k or 1)),
        }.get(name)
        return ANSWER if code is None else f"<helpers>\n{code}\n</helpers>"


# Statistics and printing.


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 and a == a and b == b else "n/a"


def table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[object]], notes: Sequence[str] = ()
) -> None:
    print(f"\n### {title}\n")
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        print(line(row))
    for note in notes:
        print(f"\n{note}")
    sys.stdout.flush()


# Processes.


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def clean_env(**overrides: str) -> dict[str, str]:
    """This process's environment without SABRE_*/OPENAI_* settings, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SABRE_", "OPENAI_"))}
    env.update(overrides)
    return env


def sabre_env(*, dsn: str, llm: ScriptedLLM, data_dir: Path, **overrides: str) -> dict[str, str]:
    """``sabre serve``'s environment for a bench: PostgreSQL + Redis, the scripted model over Chat
    Completions, ``data_dir``, plus ``overrides``."""
    return clean_env(
        SABRE_DATABASE_URL=dsn,
        SABRE_REDIS_URL=REDIS_URL,
        OPENAI_BASE_URL=llm.base_url,
        OPENAI_API_KEY="sk-bench",
        SABRE_LLM_API="chat",
        SABRE_MODEL="scripted-model",
        SABRE_DATA_DIR=str(data_dir),
        **overrides,
    )


def launch(name: str, argv: list[str], env: dict[str, str], port: int, logdir: Path) -> Server:
    log = logdir / f"{name}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return Server(name, f"http://127.0.0.1:{port}", process, log)


async def wait_ready(server: Server, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(
                    f"{server.name} exited ({server.process.returncode}):\n{server.log_tail()}"
                )
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(f"{server.url}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{server.name} not ready after {within:.0f} s:\n{server.log_tail()}")


# Requests.


@dataclass
class Timed:
    latency: float
    llm: float
    response: httpx.Response

    @property
    def overhead(self) -> float:
        return self.latency - self.llm

    @property
    def body(self) -> dict[str, Any]:
        return self.response.json()  # type: ignore[no-any-return]


@dataclass
class Bench:
    llm: ScriptedLLM
    responder: Responder
    sabre: str
    floor: str
    langgraph: str
    quick: bool
    sabre_pid: int
    floor_pid: int
    langgraph_pid: int
    databases: tuple[str, ...] = ()
    floor_p50: float = float("nan")
    errors: list[str] = field(default_factory=list)

    def llm_time(self) -> float:
        """The scripted model's own time so far: answering plus choosing the reply."""
        return self.llm.time_spent + self.responder.spent

    async def post(self, client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Timed:
        llm_before = self.llm_time()
        started = time.perf_counter()
        response = await client.post(url, json=body)
        latency = time.perf_counter() - started
        return Timed(latency, self.llm_time() - llm_before, response)

    def check(self, timed: Timed, expect: str) -> bool:
        """Record (do not raise) a response that is not what the scenario expects."""
        ok = timed.response.is_success and (expect == "any" or timed.response.json().get("status") == expect)
        if not ok and len(self.errors) < 20:
            self.errors.append(
                f"expected {expect}: HTTP {timed.response.status_code} {timed.response.text[:300]}"
            )
        return ok

    # SABRE requests.

    async def create(self, client: httpx.AsyncClient, tag: str, *, tools: bool = False) -> Timed:
        body: dict[str, Any] = {"input": f"[bench:{tag}] please"}
        if tools:
            body["tools"] = [GET_ORDER]
        return await self.post(client, f"{self.sabre}/v1/conversations", body)

    async def message(self, client: httpx.AsyncClient, conversation: str) -> Timed:
        return await self.post(
            client, f"{self.sabre}/v1/conversations/{conversation}/messages", {"input": "again"}
        )

    async def resume(self, client: httpx.AsyncClient, turn: dict[str, Any], output: Any) -> Timed:
        call = turn["pending_tool_calls"][0]
        return await self.post(
            client,
            f"{self.sabre}/v1/conversations/{turn['conversation_id']}/tool-results",
            {"results": [{"tool_call_id": call["id"], "output": output}]},
        )

    # LangGraph build requests (bench/langgraph_app.py).

    async def langgraph_start(self, client: httpx.AsyncClient) -> Timed:
        return await self.post(client, f"{self.langgraph}/conversations", {"input": "[bench:call] please"})

    async def langgraph_resume(self, client: httpx.AsyncClient, turn: dict[str, Any], output: Any) -> Timed:
        call = turn["pending_tool_calls"][0]
        return await self.post(
            client,
            f"{self.langgraph}/conversations/{turn['conversation_id']}/tool-results",
            {"results": [{"tool_call_id": call["id"], "output": output}]},
        )

    async def floor_request(self, client: httpx.AsyncClient, conversation: str, body: str) -> Timed:
        return await self.post(client, f"{self.floor}/items", {"conversation": conversation, "body": body})

    # The DESIGN §9 workload, one conversation of two requests.

    async def sabre_conversation(self, client: httpx.AsyncClient) -> tuple[Timed, Timed] | None:
        created = await self.create(client, "work", tools=True)
        if not self.check(created, "awaiting_tool_results"):
            return None
        resumed = await self.resume(client, created.body, {"status": "shipped"})
        if not self.check(resumed, "completed"):
            return None
        return created, resumed

    async def langgraph_conversation(self, client: httpx.AsyncClient) -> tuple[Timed, Timed] | None:
        started = await self.langgraph_start(client)
        if not self.check(started, "awaiting_tool_results"):
            return None
        resumed = await self.langgraph_resume(client, started.body, {"status": "shipped"})
        if not self.check(resumed, "completed"):
            return None
        return started, resumed

    async def floor_conversation(self, client: httpx.AsyncClient) -> tuple[Timed, Timed] | None:
        conversation = secrets.token_hex(8)
        first = await self.floor_request(client, conversation, "start")
        if not self.check(first, "any"):
            return None
        second = await self.floor_request(client, conversation, "resume")
        if not self.check(second, "any"):
            return None
        return first, second


# Sections.


async def floor_baseline(bench: Bench, client: httpx.AsyncClient, n: int) -> list[float]:
    """Sequential floor requests; its p50 is the unit the other sections are compared with."""
    for _ in range(20):
        await bench.floor_conversation(client)
    latencies: list[float] = []
    for _ in range(n):
        pair = await bench.floor_conversation(client)
        if pair:
            latencies.extend(t.latency for t in pair)
    bench.floor_p50 = pct(latencies, 50)
    return latencies


async def turn_overhead(bench: Bench, client: httpx.AsyncClient, n: int) -> None:
    created = await bench.create(client, "turn")
    bench.check(created, "completed")
    conversation = created.body["conversation_id"]
    for _ in range(10):  # warm-up (and a conversation with some history, like a real one)
        bench.check(await bench.message(client, conversation), "completed")
    samples = [await bench.message(client, conversation) for _ in range(n)]
    samples = [s for s in samples if bench.check(s, "completed")]
    lat = [s.latency for s in samples]
    llm = [s.llm for s in samples]
    over = [s.overhead for s in samples]
    rows = [
        ["request latency", ms(pct(lat, 50)), ms(pct(lat, 95)), ratio(pct(lat, 50), bench.floor_p50)],
        ["scripted LLM time (2 calls)", ms(pct(llm, 50)), ms(pct(llm, 95)), ""],
        [
            "**overhead** (latency - LLM)",
            ms(pct(over, 50)),
            ms(pct(over, 95)),
            ratio(pct(over, 50), bench.floor_p50),
        ],
        ["floor request (same run)", ms(bench.floor_p50), "", "1.00x"],
    ]
    # The conversation grows by one turn per request: show whether the overhead grows with it.
    window = max(1, min(20, len(samples) // 5))
    first_turn = 12  # turn 1 is the create, turns 2-11 the warm-up
    for label, part, start in (
        ("first", samples[:window], first_turn),
        ("last", samples[-window:], first_turn + len(samples) - window),
    ):
        part_over = [s.overhead for s in part]
        rows.append(
            [
                f"overhead, {label} {len(part)} timed turns (turns {start}-{start + len(part) - 1})",
                ms(pct(part_over, 50)),
                ms(pct(part_over, 95)),
                ratio(pct(part_over, 50), bench.floor_p50),
            ]
        )
    table(
        f"2. Turn overhead: one `<helpers>` block then an answer, {len(samples)} sequential "
        f"POST /messages on one conversation",
        ["", "p50 ms", "p95 ms", "p50 / floor p50"],
        rows,
        [
            f"Each turn: model → block `{TURN_BLOCK!r}` in the sandbox → model → answer (2 LLM calls). "
            "All turns go to one conversation, so its history grows by 4 messages per turn; the last "
            "two rows compare the start and the end of the run."
        ],
    )


async def snapshot_size(bench: Bench, client: httpx.AsyncClient, dsn: str) -> None:
    trivial = await bench.create(client, "turn")
    frame = await bench.create(client, "df")
    ok = bench.check(trivial, "completed") & bench.check(frame, "completed")
    if not ok:
        print("\n### 3. Snapshot size\n\n(skipped: the turns failed, see errors below)")
        return
    connection = await asyncpg.connect(dsn)
    try:
        sizes = {}
        for label, timed in (("trivial", trivial), ("df", frame)):
            sizes[label] = await connection.fetchval(
                "SELECT coalesce(length(snapshot), 0) FROM conversations WHERE id = $1",
                timed.body["conversation_id"],
            )
    finally:
        await connection.close()
    import pandas as pd

    df = pd.DataFrame(
        {"a": np.arange(1000), "b": np.random.rand(1000), "c": [f"row{i}" for i in range(1000)]}
    )
    raw = len(pickle.dumps(df, protocol=pickle.HIGHEST_PROTOCOL))
    rows = [
        ["`x = 1` (namespace: one int)", sizes["trivial"], f"{sizes['trivial'] / 1024:.1f}", ""],
        [
            "1,000-row DataFrame (int, float, str columns)",
            sizes["df"],
            f"{sizes['df'] / 1024:.1f}",
            ratio(sizes["df"], raw),
        ],
        ["reference: `pickle.dumps(df)` in this process", raw, f"{raw / 1024:.1f}", "1.00x"],
    ]
    table(
        "3. Snapshot size: `length(conversations.snapshot)` read from PostgreSQL",
        ["namespace", "bytes", "KB", "vs plain pickle"],
        rows,
    )


async def pause_resume(bench: Bench, client: httpx.AsyncClient, per_k: int) -> None:
    ks = (1, 10, 100)
    final: dict[int, list[Timed]] = {k: [] for k in ks}
    # Pause → pause resumes from the K=100 conversations, by how many calls were answered before.
    to_pause: dict[int, list[Timed]] = {0: [], 1: [], 10: [], 99: []}
    # K values are interleaved so that drift on a noisy machine hits them alike; round 0 warms up.
    for rep in range(per_k + 1):
        for k in ks:
            turn = await bench.create(client, f"loop:{k + 1}", tools=True)
            if not bench.check(turn, "awaiting_tool_results"):
                continue
            body = turn.body
            for earlier in range(k):
                timed = await bench.resume(client, body, {"n": 1})
                if not bench.check(timed, "awaiting_tool_results"):
                    break
                if k == 100 and earlier in to_pause and rep > 0:
                    to_pause[earlier].append(timed)
                body = timed.body
            else:
                timed = await bench.resume(client, body, {"n": 1})
                if bench.check(timed, "completed") and rep > 0:
                    final[k].append(timed)
    base = pct([t.overhead for t in final[1]], 50)
    rows = []
    for k in ks:
        over = [t.overhead for t in final[k]]
        lat = [t.latency for t in final[k]]
        rows.append(
            [
                k,
                len(over),
                ms(pct(lat, 50)),
                ms(pct([t.llm for t in final[k]], 50)),
                ms(pct(over, 50)),
                ms(pct(over, 95)),
                ratio(pct(over, 50), base),
                ratio(pct(over, 50), bench.floor_p50),
            ]
        )
    table(
        "4a. Resume after K earlier external calls in one block (the resume that lets the block "
        "finish → model → answer)",
        [
            "K",
            "n",
            "latency p50 ms",
            "LLM p50 ms",
            "overhead p50 ms",
            "overhead p95 ms",
            "vs K=1",
            "vs floor p50",
        ],
        rows,
        [
            f"**resume@100 / resume@1 = {ratio(pct([t.overhead for t in final[100]], 50), base)}** "
            "(DESIGN budget: ≤ 2x). The block calls `get_order_details` K+1 times in a loop; the first "
            "K resumes are taken untimed, the (K+1)-th is timed; K values are interleaved, one warm-up "
            "round is dropped. Overhead = latency - scripted LLM time."
        ],
    )
    base_pause = pct([t.overhead for t in to_pause[1]], 50)
    rows = []
    for earlier, samples in to_pause.items():
        over = [t.overhead for t in samples]
        rows.append(
            [
                earlier,
                len(over),
                ms(pct(over, 50)),
                ms(pct(over, 95)),
                ratio(pct(over, 50), base_pause),
                ratio(pct(over, 50), bench.floor_p50),
            ]
        )
    table(
        "4b. Resume → next pause (no model call), from the K=100 conversations",
        ["calls answered before this resume", "n", "p50 ms", "p95 ms", "vs 1", "vs floor p50"],
        rows,
        [
            "Row j: the resume that answers call j+1 of the loop and stops at call j+2, so the "
            "block re-runs with j+1 answers to replay."
        ],
    )


TARGETS = ("floor", "LangGraph", "SABRE")
"""The DESIGN §9 targets, in the order they are run and printed."""


@dataclass
class Workload:
    """One target's figures on the DESIGN §9 workload: sequential requests, then the 8-client load."""

    starts: list[Timed] = field(default_factory=list)
    resumes: list[Timed] = field(default_factory=list)
    load: LoadResult | None = None

    def latency(self, part: str, q: float) -> float:
        return pct([t.latency for t in (self.starts if part == "start" else self.resumes)], q)

    def cpu_ms(self, group: str) -> float:
        """Milliseconds of CPU per request of the load window spent by ``group``."""
        if self.load is None or self.load.conversations == 0:
            return float("nan")
        return 1000 * self.load.cores[group] * self.load.seconds / (2 * self.load.conversations)

    def service_ms(self) -> float:
        """CPU ms per request of the service itself: its server processes and its sandboxes."""
        return self.cpu_ms("server") + self.cpu_ms("sandboxes")


def runners(bench: Bench) -> dict[str, Callable[[httpx.AsyncClient], Awaitable[tuple[Timed, Timed] | None]]]:
    return {
        "floor": bench.floor_conversation,
        "LangGraph": bench.langgraph_conversation,
        "SABRE": bench.sabre_conversation,
    }


async def sequential_workload(bench: Bench, client: httpx.AsyncClient, n: int) -> dict[str, Workload]:
    """``n`` conversations on each target, one request at a time, interleaved so drift hits all alike."""
    run = runners(bench)
    for _ in range(10):
        for name in TARGETS:
            await run[name](client)
    results = {name: Workload() for name in TARGETS}
    for i in range(n):
        for name in TARGETS[i % 3 :] + TARGETS[: i % 3]:
            pair = await run[name](client)
            if pair:
                results[name].starts.append(pair[0])
                results[name].resumes.append(pair[1])
    floor, lg = results["floor"], results["LangGraph"]
    rows = []
    for name in TARGETS:
        w = results[name]
        rows.append(
            [
                name,
                len(w.starts),
                ms(w.latency("start", 50)),
                ms(w.latency("start", 90)),
                ms(w.latency("resume", 50)),
                ms(w.latency("resume", 90)),
                ms(pct([t.overhead for t in w.starts + w.resumes], 50)) if name != "floor" else "",
                f"{ratio(w.latency('start', 50), floor.latency('start', 50))} / "
                f"{ratio(w.latency('resume', 50), floor.latency('resume', 50))}",
                f"{ratio(w.latency('start', 50), lg.latency('start', 50))} / "
                f"{ratio(w.latency('resume', 50), lg.latency('resume', 50))}",
            ]
        )
    table(
        f"5a. DESIGN §9 workload, sequential ({n} conversations per target, interleaved)",
        [
            "",
            "conversations",
            "start p50 ms",
            "start p90 ms",
            "resume p50 ms",
            "resume p90 ms",
            "p50 minus LLM ms",
            "p50 vs floor (start / resume)",
            "p50 vs LangGraph (start / resume)",
        ],
        rows,
        [
            "A conversation: start (→ model → external tool requested → pause, the response carries the "
            "call) then resume with the result (→ model → answer); the floor does two one-row "
            "transactions instead. 'p50 minus LLM' takes the scripted model's own time out of every "
            "request. Ten conversations per target are dropped first (warm-up)."
        ],
    )
    return results


CPU_GROUPS = ("bench process", "server", "sandboxes", "postgres", "redis")


def _ours(pid: int, databases: Sequence[str]) -> bool:
    """A PostgreSQL process this run loads: a backend on one of its databases, or a shared auxiliary one
    (postmaster, WAL writer, checkpointer...), not the backends of other users of a shared server."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    if any(f" {name} " in title for name in databases):
        return True
    return "(" not in title and "[local]" not in title and "autovacuum worker" not in title


def cpu_seconds(server_pid: int, databases: Sequence[str] = ()) -> dict[str, float]:
    """CPU seconds so far (user + system) by group, from /proc (Linux).

    The server's tree includes reaped children (sandbox processes); PostgreSQL counts only the
    processes ``_ours`` picks, without reaped children (the postmaster reaps every client's backends),
    when ``databases`` is given, and every ``postgres`` process with its reaped children otherwise.
    """
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, str, float, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        own = sum(int(f) for f in fields[11:13]) / tick
        reaped = sum(int(f) for f in fields[13:15]) / tick
        stats[int(entry)] = (int(fields[1]), comm, own, reaped)
    tree = {server_pid}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, *_) in stats.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    sandboxes = _sandbox_processes(tree - {server_pid}, stats)
    totals = dict.fromkeys(CPU_GROUPS, 0.0)
    for pid, (_, comm, own, reaped) in stats.items():
        if pid == os.getpid():
            totals["bench process"] += own + reaped
        elif pid in sandboxes:
            totals["sandboxes"] += own + reaped
        elif pid in tree:
            totals["server"] += own + reaped
        elif comm == "postgres":
            if not databases:
                totals["postgres"] += own + reaped
            elif _ours(pid, databases):
                totals["postgres"] += own
        elif comm.startswith("redis-server"):
            totals["redis"] += own + reaped
    return totals


def _sandbox_processes(below: set[int], stats: dict[int, tuple[int, str, float, float]]) -> set[int]:
    """Of the server's descendants ``below``: SABRE's sandbox (bubblewrap, a zygote or worker of
    ``app.runtime.worker``) and everything under it. The rest are web server processes."""

    def sandbox(pid: int) -> bool:
        if stats[pid][1] == "bwrap":
            return True
        try:
            return b"app.runtime.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    roots = {pid for pid in below if sandbox(pid)}
    found = set(roots)
    grew = True
    while grew:
        grew = False
        for pid in below - found:
            if stats[pid][0] in found:
                found.add(pid)
                grew = True
    return found


@dataclass
class LoadResult:
    conversations: int
    seconds: float
    latencies: list[float]
    failures: int
    cores: dict[str, float]

    @property
    def rate(self) -> float:
        return self.conversations / self.seconds

    def __add__(self, other: LoadResult) -> LoadResult:
        """Two windows of one target as one (cores weighted by each window's length)."""
        seconds = self.seconds + other.seconds
        cores = {
            g: (self.cores[g] * self.seconds + other.cores[g] * other.seconds) / seconds for g in CPU_GROUPS
        }
        return LoadResult(
            self.conversations + other.conversations,
            seconds,
            self.latencies + other.latencies,
            self.failures + other.failures,
            cores,
        )


async def load(
    run_one: Callable[[httpx.AsyncClient], Awaitable[tuple[Timed, Timed] | None]],
    *,
    server_pid: int,
    databases: Sequence[str] = (),
    clients: int,
    warmup: float,
    duration: float,
) -> LoadResult:
    """``clients`` loops of back-to-back conversations; count those finished inside the window."""
    start = time.perf_counter()
    window = (start + warmup, start + warmup + duration)
    done: list[float] = []
    latencies: list[float] = []
    failures = 0

    async def worker() -> None:
        nonlocal failures
        async with httpx.AsyncClient(timeout=60) as client:
            while time.perf_counter() < window[1]:
                began = time.perf_counter()
                pair = await run_one(client)
                finished = time.perf_counter()
                if pair is None:
                    failures += 1
                elif began >= window[0] and finished <= window[1]:
                    done.append(finished)
                    latencies.extend(t.latency for t in pair)
                elif window[0] <= finished <= window[1]:
                    done.append(finished)

    async def sample() -> dict[str, float]:
        await asyncio.sleep(max(0.0, window[0] - time.perf_counter()))
        before, started = cpu_seconds(server_pid, databases), time.perf_counter()
        await asyncio.sleep(max(0.0, window[1] - time.perf_counter()))
        after, elapsed = cpu_seconds(server_pid, databases), time.perf_counter() - started
        return {k: (after[k] - before[k]) / elapsed for k in CPU_GROUPS}

    sampler = asyncio.create_task(sample())
    await asyncio.gather(*(worker() for _ in range(clients)))
    return LoadResult(len(done), duration, latencies, failures, await sampler)


async def concurrent_workload(bench: Bench, duration: float, results: dict[str, Workload]) -> None:
    clients = 8
    run = runners(bench)
    pids = {"floor": bench.floor_pid, "LangGraph": bench.langgraph_pid, "SABRE": bench.sabre_pid}
    # Two windows of duration/2 per target, in the order A B C C B A, so that a load that drifts
    # (other work on a shared machine) weighs on every target alike.
    for name in (*TARGETS, *reversed(TARGETS)):
        window = await load(
            run[name],
            server_pid=pids[name],
            databases=bench.databases,
            clients=clients,
            warmup=1.0,
            duration=duration / 2,
        )
        previous = results[name].load
        results[name].load = window if previous is None else previous + window
    loads = {name: results[name].load for name in TARGETS}
    floor, lg = loads["floor"], loads["LangGraph"]
    assert floor is not None
    assert lg is not None
    rows = []
    for name in TARGETS:
        r = loads[name]
        assert r is not None
        rows.append(
            [
                name,
                r.conversations,
                f"{r.rate:.1f}",
                ms(pct(r.latencies, 50)),
                ms(pct(r.latencies, 95)),
                r.failures,
                ratio(r.rate, floor.rate),
                ratio(r.rate, lg.rate),
            ]
        )
    table(
        f"5b. DESIGN §9 workload, {clients} concurrent clients, {duration:g} s per target",
        [
            "",
            "conversations",
            "conversations/s",
            "request p50 ms",
            "request p95 ms",
            "failed",
            "vs floor",
            "vs LangGraph",
        ],
        rows,
        [
            f"Each target is loaded in two windows of {duration / 2:g} s (after 1 s of warm-up each), "
            "in the order floor, LangGraph, SABRE, SABRE, LangGraph, floor. The 8 clients and the "
            "scripted LLM run in the bench process, on the same cores as the servers."
        ],
    )
    cpu_rows = []
    for name in TARGETS:
        r = loads[name]
        assert r is not None
        w = results[name]
        cpu_rows.append(
            [
                name,
                *(f"{r.cores[g]:.2f}" for g in CPU_GROUPS),
                f"{sum(r.cores.values()):.2f}",
                f"{w.cpu_ms('server'):.2f}",
                f"{w.cpu_ms('sandboxes'):.2f}",
                f"{w.cpu_ms('postgres'):.2f}",
                f"{w.service_ms() + w.cpu_ms('postgres') + w.cpu_ms('redis'):.2f}",
            ]
        )
    table(
        "5c. Where the CPU went during each load window: cores busy on average, and CPU ms per request",
        [
            "",
            *CPU_GROUPS,
            "total",
            "server ms/request",
            "sandboxes ms/request",
            "postgres ms/request",
            "service + stores ms/request",
        ],
        cpu_rows,
        [
            f"The machine has {os.cpu_count()} cores. 'bench process' = the 8 HTTP clients + the "
            "scripted LLM; 'server' = the served process and its web workers; 'sandboxes' = SABRE's "
            "bubblewrap, zygote, workers and blocks below it; "
            "'postgres' = the backends connected to this run's databases (others on a shared server "
            "are left out); a request is half a conversation."
        ],
    )


def met(ok: bool) -> str:
    return "met" if ok else "not met"


def summary(results: dict[str, Workload]) -> dict[str, dict[str, float]]:
    """The headline: the three targets side by side, with ratios and issue 12's goals."""
    metrics = {
        name: {
            "start_p50_ms": 1000 * w.latency("start", 50),
            "start_p90_ms": 1000 * w.latency("start", 90),
            "resume_p50_ms": 1000 * w.latency("resume", 50),
            "resume_p90_ms": 1000 * w.latency("resume", 90),
            "conversations_per_s": w.load.rate if w.load else float("nan"),
            "server_cpu_ms_per_request": w.service_ms(),
            "sandbox_cpu_ms_per_request": w.cpu_ms("sandboxes"),
            "stores_cpu_ms_per_request": w.cpu_ms("postgres") + w.cpu_ms("redis"),
        }
        for name, w in results.items()
    }
    keys = list(metrics["floor"])

    def ratio_row(a: str, b: str) -> list[str]:
        return [f"**{a} / {b}**", *(ratio(metrics[a][k], metrics[b][k]) for k in keys)]

    sabre, lg, floor = metrics["SABRE"], metrics["LangGraph"], metrics["floor"]
    goals = [
        ("start p50 ≤ 0.5x LangGraph", sabre["start_p50_ms"] / lg["start_p50_ms"], GOAL_VS_LANGGRAPH_P50),
        ("resume p50 ≤ 0.5x LangGraph", sabre["resume_p50_ms"] / lg["resume_p50_ms"], GOAL_VS_LANGGRAPH_P50),
        ("start p50 ≤ 3x floor", sabre["start_p50_ms"] / floor["start_p50_ms"], GOAL_VS_FLOOR_P50),
        ("resume p50 ≤ 3x floor", sabre["resume_p50_ms"] / floor["resume_p50_ms"], GOAL_VS_FLOOR_P50),
    ]
    rate = sabre["conversations_per_s"] / lg["conversations_per_s"]
    verdicts = [f"{label}: {value:.2f}x ({met(value <= goal)})" for label, value, goal in goals]
    verdicts.append(f"conversations/s ≥ 3x LangGraph: {rate:.2f}x ({met(rate >= GOAL_VS_LANGGRAPH_RATE)})")
    table(
        "6. Side by side: SABRE, the LangGraph build and the floor on the DESIGN §9 workload",
        [
            "",
            "start p50 ms",
            "start p90 ms",
            "resume p50 ms",
            "resume p90 ms",
            "conversations/s, 8 clients",
            "server CPU ms/request",
            "of which sandboxes",
            "PG + Redis CPU ms/request",
        ],
        [
            *(
                [name, *(f"{metrics[name][k]:.2f}" if "ms" in k else f"{metrics[name][k]:.1f}" for k in keys)]
                for name in ("floor", "LangGraph", "SABRE")
            ),
            ratio_row("SABRE", "LangGraph"),
            ratio_row("SABRE", "floor"),
            ratio_row("LangGraph", "floor"),
        ],
        [
            "Latencies from 5a (sequential), rate and CPU from 5b/5c (8 clients). Issue 12's goals for "
            "SABRE: " + "; ".join(verdicts) + "."
        ],
    )
    return metrics


def throughput_budget(results: dict[str, Workload]) -> None:
    """What the throughput goal leaves SABRE on this machine: the CPU per conversation that
    ``GOAL_VS_LANGGRAPH_RATE`` times LangGraph's rate allows on all its cores, set against what
    each part used per conversation in SABRE's load windows (5c). The bench's own clients and
    model, and the stores, come out of that budget whatever the service does."""
    sabre, lg = results["SABRE"].load, results["LangGraph"].load
    cores = os.cpu_count() or 1
    if sabre is None or lg is None or not sabre.conversations or not lg.conversations:
        return
    goal_rate = GOAL_VS_LANGGRAPH_RATE * lg.rate
    budget = 1000 * cores / goal_rate

    def per_conversation(*groups: str) -> float:
        return 1000 * sum(sabre.cores[g] for g in groups) / sabre.rate

    outside = per_conversation("bench process", "postgres", "redis")
    left = budget - outside
    rows = [
        [f"the goal's budget: {cores} cores at {goal_rate:.1f} conversations/s", f"{budget:.2f}", ""],
        [
            "SABRE's run: the bench process (clients, scripted model)",
            f"{per_conversation('bench process'):.2f}",
            "",
        ],
        ["SABRE's run: PostgreSQL + Redis", f"{per_conversation('postgres', 'redis'):.2f}", ""],
        ["left for SABRE's server and sandboxes", f"{left:.2f}", "1.00x"],
    ]
    for label, groups in (
        ("SABRE's server, measured", ("server",)),
        ("SABRE's sandboxes, measured", ("sandboxes",)),
        ("server + sandboxes, measured", ("server", "sandboxes")),
    ):
        used = per_conversation(*groups)
        rows.append([label, f"{used:.2f}", ratio(used, left)])
    table(
        f"6b. The throughput goal's CPU budget per conversation "
        f"({GOAL_VS_LANGGRAPH_RATE:g}x LangGraph's conversations/s)",
        ["", "CPU ms per conversation", "vs what is left"],
        rows,
        [
            "CPU per conversation = cores busy in SABRE's load windows (5c) / its conversations per "
            "second. A conversation is two requests: the start's block runs in a fresh sandbox "
            "process (a process never serves two conversations), the resume in that live one. "
            "The budget counts every core as the bench's: read it on an otherwise idle machine. "
            "Nothing is asserted."
        ],
    )


# Main.


def uvicorn_argv(target: str, port: int, web_workers: int) -> list[str]:
    """A peer app under uvicorn, with SABRE's server settings (workers; loop and HTTP parser on auto)."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        target,
        "--port",
        str(port),
        "--workers",
        str(web_workers),
        "--loop",
        "auto",
        "--http",
        "auto",
        "--log-level",
        "warning",
    ]


async def run(
    quick: bool,
    *,
    runtime_workers: int,
    live_processes: int | None,
    live_seconds: float | None,
    preload: str | None,
    plain_workers: int | None,
    web_workers: int,
    workload_only: bool,
    json_out: Path | None,
) -> None:
    if importlib.util.find_spec("langgraph") is None or importlib.util.find_spec("langchain_openai") is None:
        raise SystemExit(
            "the LangGraph build needs the bench dependency group: "
            "uv run --group bench python bench/service_bench.py"
        )
    n_turns = 30 if quick else 200
    per_k = 5 if quick else 20
    duration = 3.0 if quick else 10.0
    token = secrets.token_hex(4)
    name, lg_name = f"sabre_bench_{token}", f"sabre_bench_lg_{token}"
    base = ADMIN_DSN.rsplit("/", 1)[0]
    dsn, lg_dsn = f"{base}/{name}", f"{base}/{lg_name}"
    admin = await asyncpg.connect(ADMIN_DSN, timeout=5)
    servers: list[Server] = []
    responder = Responder()
    llm = ScriptedLLM(responder=responder)
    tmp = tempfile.TemporaryDirectory(prefix="sabre_bench_")
    bench: Bench | None = None
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        await admin.execute(f'CREATE DATABASE "{lg_name}"')
        migrate_started = time.perf_counter()
        await upgrade("postgresql+asyncpg://" + dsn.split("://", 1)[1])
        migrate_seconds = time.perf_counter() - migrate_started
        llm.start()
        tmpdir = Path(tmp.name)
        sabre_port, floor_port, lg_port = free_port(), free_port(), free_port()
        served_env = sabre_env(
            dsn=dsn,
            llm=llm,
            data_dir=tmpdir / "data",
            SABRE_RUNTIME_WORKERS=str(runtime_workers),
            HOME=str(tmpdir),
        )
        if live_processes is not None:
            served_env["SABRE_RUNTIME_LIVE_PROCESSES"] = str(live_processes)
        if live_seconds is not None:
            served_env["SABRE_RUNTIME_LIVE_SECONDS"] = str(live_seconds)
        if preload is not None:
            served_env["SABRE_RUNTIME_PRELOAD"] = preload
        if plain_workers is not None:
            served_env["SABRE_RUNTIME_PLAIN_WORKERS"] = str(plain_workers)
        lg_env = clean_env(
            LANGGRAPH_DATABASE_URL=lg_dsn,
            OPENAI_BASE_URL=llm.base_url,
            OPENAI_API_KEY="sk-bench",
            LANGGRAPH_MODEL="scripted-model",
            LANGSMITH_TRACING="false",
            LANGCHAIN_TRACING_V2="false",
        )
        sabre_argv = [sys.executable, "-m", "app.cli", "serve", "--port", str(sabre_port)]
        sabre_argv += ["--workers", str(web_workers)]
        servers.append(launch("sabre", sabre_argv, served_env, sabre_port, tmpdir))
        servers.append(
            launch(
                "floor",
                uvicorn_argv("bench.floor_app:app", floor_port, web_workers),
                clean_env(FLOOR_DATABASE_URL=dsn),
                floor_port,
                tmpdir,
            )
        )
        servers.append(
            launch(
                "langgraph",
                uvicorn_argv("bench.langgraph_app:app", lg_port, web_workers),
                lg_env,
                lg_port,
                tmpdir,
            )
        )
        started = time.perf_counter()
        await asyncio.gather(*(wait_ready(s) for s in servers))
        ready_seconds = time.perf_counter() - started
        bench = Bench(
            llm=llm,
            responder=responder,
            sabre=servers[0].url,
            floor=servers[1].url,
            langgraph=servers[2].url,
            quick=quick,
            sabre_pid=servers[0].process.pid,
            floor_pid=servers[1].process.pid,
            langgraph_pid=servers[2].process.pid,
            databases=(name, lg_name),
        )
        versions = ", ".join(
            f"{package} {importlib.metadata.version(package)}"
            for package in ("langgraph", "langgraph-checkpoint-postgres", "langchain-openai")
        )

        print(f"# SABRE service benchmark{' (--quick)' if quick else ''}\n")
        table(
            "1. Setup",
            ["", ""],
            [
                [
                    "machine",
                    f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
                ],
                [
                    "databases",
                    f"`{name}` (SABRE and the floor; migrated in {migrate_seconds:.2f} s) and `{lg_name}` "
                    "(LangGraph's checkpointer), fresh, dropped at the end",
                ],
                [
                    "SABRE",
                    f"`python -m app.cli serve --workers {web_workers}`, PostgreSQL + Redis, "
                    f"{runtime_workers} sandbox workers, chat API"
                    + ("" if live_processes is None else f", {live_processes} live processes")
                    + ("" if live_seconds is None else f", live for {live_seconds:g} s")
                    + ("" if preload is None else f", preloading {preload or 'nothing'}")
                    + ("" if plain_workers is None else f", {plain_workers} plain workers"),
                ],
                [
                    "LangGraph",
                    f"`uvicorn bench.langgraph_app:app --workers {web_workers}`: FastAPI + StateGraph, "
                    f"interrupt() for the external tool, AsyncPostgresSaver on one psycopg pool ({versions})",
                ],
                [
                    "floor",
                    f"`uvicorn bench.floor_app:app --workers {web_workers}`: FastAPI + 1 PG transaction "
                    "(SQLAlchemy/asyncpg)",
                ],
                ["model", "one ScriptedLLM in the bench process for all, instant replies, chat API"],
                ["all ready after", f"{ready_seconds:.2f} s"],
            ],
        )
        async with httpx.AsyncClient(timeout=120) as client:
            await floor_baseline(bench, client, n_turns)
            if not workload_only:
                await turn_overhead(bench, client, n_turns)
                await snapshot_size(bench, client, dsn)
                await pause_resume(bench, client, per_k)
            results = await sequential_workload(bench, client, n_turns)
        await concurrent_workload(bench, duration, results)
        metrics = summary(results)
        throughput_budget(results)
        if json_out is not None:
            report = json.dumps({"quick": quick, "targets": metrics}, indent=2) + "\n"
            await asyncio.to_thread(json_out.write_text, report)
        print(
            f"\nScripted LLM: {len(llm.requests)} requests, {bench.llm_time():.2f} s of its own time in all "
            f"({responder.spent:.2f} s of it choosing replies)."
        )
        if bench.errors:
            print(f"\n**{len(bench.errors)} unexpected response(s)** (first ones):")
            for error in bench.errors[:5]:
                print(f"- {error}")
    finally:
        for server in servers:
            server.stop()
        if bench is not None and bench.errors:
            for server in servers:
                tail = server.log_tail(15)
                if tail:
                    print(f"\n{server.name} log tail:\n{tail}")
        llm.stop()
        for database in (name, lg_name):
            with contextlib.suppress(Exception):
                await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()
        tmp.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples and a shorter load test")
    parser.add_argument("--runtime-workers", type=int, default=2, help="SABRE_RUNTIME_WORKERS of the server")
    parser.add_argument(
        "--live-processes",
        type=int,
        default=None,
        help="SABRE_RUNTIME_LIVE_PROCESSES of the server (default: the service's)",
    )
    parser.add_argument(
        "--live-seconds",
        type=float,
        default=None,
        help="SABRE_RUNTIME_LIVE_SECONDS of the server (0: every block and resume in a fresh fork)",
    )
    parser.add_argument(
        "--preload",
        default=None,
        help="SABRE_RUNTIME_PRELOAD of the server ('' for none; default: the service's)",
    )
    parser.add_argument(
        "--plain-workers",
        type=int,
        default=None,
        help="SABRE_RUNTIME_PLAIN_WORKERS of the server (0: every block on preloaded workers)",
    )
    parser.add_argument(
        "--web-workers", type=int, default=1, help="server processes of SABRE, LangGraph and the floor alike"
    )
    parser.add_argument(
        "--workload-only",
        action="store_true",
        help="only the DESIGN §9 comparison (sections 5-6): skip turn overhead, snapshot size, resume@K",
    )
    parser.add_argument("--json", type=Path, help="also write section 6's figures to this JSON file")
    args = parser.parse_args()
    asyncio.run(
        run(
            args.quick,
            runtime_workers=args.runtime_workers,
            live_processes=args.live_processes,
            live_seconds=args.live_seconds,
            preload=args.preload,
            plain_workers=args.plain_workers,
            web_workers=args.web_workers,
            workload_only=args.workload_only,
            json_out=args.json,
        )
    )


if __name__ == "__main__":
    main()
