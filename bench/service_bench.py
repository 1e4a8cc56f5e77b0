"""SABRE service benchmark: turn overhead, snapshot size, pause/resume cost, and the DESIGN §9 workload
against the floor, all in one run and on one machine, printed as markdown tables.

Run: ``uv run python bench/service_bench.py [--quick]``.

What it starts: a fresh PostgreSQL database (``sabre_bench_<hex>``, migrated, dropped at the end), a
ScriptedLLM inside this process that answers instantly (its replies are chosen by a responder from a
scenario tag in the conversation's first user message), the SABRE service as a separate process
(``python -m app.cli serve``, PostgreSQL + Redis, ``--runtime-workers`` sandbox workers, default 2), and
the floor of DESIGN §9 (``bench/floor_app.py``: FastAPI + one PostgreSQL transaction per request) under
uvicorn in its own process. Nothing is asserted: figures are printed next to their budgets, and the
machines are noisy.

"LLM time" is the ScriptedLLM's own ``time_spent`` during a request; "overhead" is the request's latency
minus that, i.e. what the service adds. The scripted LLM, the HTTP clients and the servers share the
machine's cores, so absolute figures are pessimistic; ratios against the floor measured in the same run
are the figures to read.

Environment: ``SABRE_BENCH_DATABASE_URL`` (admin DSN, default postgresql://postgres@127.0.0.1:5432/postgres)
and ``SABRE_BENCH_REDIS_URL`` (default redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from app.llm.scripted import RecordedRequest, ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
ADMIN_DSN = os.environ.get("SABRE_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("SABRE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

# DESIGN §9 reference figures (LangGraph is not installed here: its numbers are quoted, not measured).
DESIGN_FLOOR_P50_MS = (3.0, 4.0)
DESIGN_FLOOR_CPS = (190, 320)
DESIGN_LANGGRAPH_P50_MS = (14.0, 18.0)
DESIGN_LANGGRAPH_CPS = (26, 34)

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


def loop_block(calls: int) -> str:
    """A block that calls the external tool ``calls`` times in a loop."""
    return (
        f"total = 0\nfor i in range({calls}):\n"
        "    total += get_order_details(order_id=str(i))['n']\nprint('total', total)"
    )


TAG = re.compile(r"\[bench:(\w+)(?::(\d+))?\]")


class Responder:
    """Answer after a block ran; otherwise send the block of the conversation's scenario.

    The scenario is the ``[bench:NAME(:K)]`` tag in the first user message, so the bench keeps no
    per-conversation state and concurrent conversations cannot mix up their replies. ScriptedLLM
    starts its ``time_spent`` clock after the responder returns, so the responder keeps its own
    clock (``spent``), which the bench adds to the model's time.
    """

    def __init__(self) -> None:
        self.spent = 0.0
        self._lock = threading.Lock()

    def __call__(self, request: RecordedRequest) -> str:
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

    def _reply(self, request: RecordedRequest) -> str:
        first, last = self._user_texts(request)
        if "<helpers_result>" in last:
            return ANSWER
        match = TAG.search(first)
        if match is None:
            return ANSWER
        name, k = match.group(1), match.group(2)
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
    quick: bool
    sabre_pid: int
    floor_pid: int
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


async def sequential_workload(bench: Bench, client: httpx.AsyncClient, n: int, floor: list[float]) -> None:
    for _ in range(10):
        await bench.sabre_conversation(client)
    creates: list[Timed] = []
    resumes: list[Timed] = []
    for _ in range(n):
        pair = await bench.sabre_conversation(client)
        if pair:
            creates.append(pair[0])
            resumes.append(pair[1])
    every = creates + resumes
    f50, f95 = pct(floor, 50), pct(floor, 95)
    lg_half = (DESIGN_LANGGRAPH_P50_MS[0] / 2, DESIGN_LANGGRAPH_P50_MS[1] / 2)
    p50 = pct([t.latency for t in every], 50)
    rows = [
        ["floor: one PG transaction", len(floor), ms(f50), ms(f95), "", "1.00x"],
        [
            "SABRE: every request",
            len(every),
            ms(pct([t.latency for t in every], 50)),
            ms(pct([t.latency for t in every], 95)),
            ms(pct([t.overhead for t in every], 50)),
            ratio(pct([t.latency for t in every], 50), f50),
        ],
        [
            "SABRE: create (→ model → block → pause)",
            len(creates),
            ms(pct([t.latency for t in creates], 50)),
            ms(pct([t.latency for t in creates], 95)),
            ms(pct([t.overhead for t in creates], 50)),
            ratio(pct([t.latency for t in creates], 50), f50),
        ],
        [
            "SABRE: resume (→ block ends → model → answer)",
            len(resumes),
            ms(pct([t.latency for t in resumes], 50)),
            ms(pct([t.latency for t in resumes], 95)),
            ms(pct([t.overhead for t in resumes], 50)),
            ratio(pct([t.latency for t in resumes], 50), f50),
        ],
    ]
    table(
        f"5a. DESIGN §9 workload, sequential ({n} conversations each = {2 * n} requests)",
        ["", "requests", "p50 ms", "p95 ms", "p50 minus LLM ms", "p50 / floor p50"],
        rows,
        [
            f"Budgets: SABRE per-request p50 ≤ 3x floor (here **{ratio(p50, f50)}**) and ≤ half the "
            f"LangGraph build, i.e. ≤ {lg_half[0]:.0f}-{lg_half[1]:.0f} ms (here **{ms(p50)} ms**). "
            "DESIGN's floor on its machines: "
            f"{DESIGN_FLOOR_P50_MS[0]:.0f}-{DESIGN_FLOOR_P50_MS[1]:.0f} ms p50; LangGraph "
            f"{DESIGN_LANGGRAPH_P50_MS[0]:.0f}-{DESIGN_LANGGRAPH_P50_MS[1]:.0f} ms p50 "
            "(LangGraph is not installed here: quoted from DESIGN.md, not measured)."
        ],
    )


CPU_GROUPS = ("bench process", "server + sandboxes", "postgres", "redis")


def cpu_seconds(server_pid: int) -> dict[str, float]:
    """CPU seconds so far (user + system, reaped children included) by group, from /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        used = sum(int(f) for f in fields[11:15]) / tick
        stats[int(entry)] = (int(fields[1]), comm, used)
    tree = {server_pid}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _, _) in stats.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    totals = dict.fromkeys(CPU_GROUPS, 0.0)
    for pid, (_, comm, used) in stats.items():
        if pid == os.getpid():
            totals["bench process"] += used
        elif pid in tree:
            totals["server + sandboxes"] += used
        elif comm == "postgres":
            totals["postgres"] += used
        elif comm.startswith("redis-server"):
            totals["redis"] += used
    return totals


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


async def load(
    run_one: Callable[[httpx.AsyncClient], Awaitable[tuple[Timed, Timed] | None]],
    *,
    server_pid: int,
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
        before, started = cpu_seconds(server_pid), time.perf_counter()
        await asyncio.sleep(max(0.0, window[1] - time.perf_counter()))
        after, elapsed = cpu_seconds(server_pid), time.perf_counter() - started
        return {k: (after[k] - before[k]) / elapsed for k in CPU_GROUPS}

    sampler = asyncio.create_task(sample())
    await asyncio.gather(*(worker() for _ in range(clients)))
    return LoadResult(len(done), duration, latencies, failures, await sampler)


async def concurrent_workload(bench: Bench, duration: float) -> None:
    clients = 8
    floor = await load(
        bench.floor_conversation,
        server_pid=bench.floor_pid,
        clients=clients,
        warmup=1.0,
        duration=duration,
    )
    sabre = await load(
        bench.sabre_conversation,
        server_pid=bench.sabre_pid,
        clients=clients,
        warmup=1.0,
        duration=duration,
    )
    target = (3 * DESIGN_LANGGRAPH_CPS[0], 3 * DESIGN_LANGGRAPH_CPS[1])
    rows = [
        [
            "floor",
            floor.conversations,
            f"{floor.rate:.1f}",
            ms(pct(floor.latencies, 50)),
            ms(pct(floor.latencies, 95)),
            floor.failures,
            "1.00x",
        ],
        [
            "SABRE",
            sabre.conversations,
            f"{sabre.rate:.1f}",
            ms(pct(sabre.latencies, 50)),
            ms(pct(sabre.latencies, 95)),
            sabre.failures,
            ratio(sabre.rate, floor.rate),
        ],
    ]
    table(
        f"5b. DESIGN §9 workload, {clients} concurrent clients for {duration:g} s (after 1 s warm-up)",
        ["", "conversations", "conversations/s", "request p50 ms", "request p95 ms", "failed", "vs floor"],
        rows,
        [
            f"Budget: SABRE ≥ 3x the LangGraph build's {DESIGN_LANGGRAPH_CPS[0]}-{DESIGN_LANGGRAPH_CPS[1]} "
            f"conversations/s, i.e. ≥ {target[0]}-{target[1]}/s: here **{sabre.rate:.1f}/s = "
            f"{sabre.rate / DESIGN_LANGGRAPH_CPS[1]:.2f}-{sabre.rate / DESIGN_LANGGRAPH_CPS[0]:.2f}x "
            "LangGraph** (LangGraph is not installed: DESIGN.md's figure, not measured here). "
            f"DESIGN's floor on its machines: {DESIGN_FLOOR_CPS[0]}-{DESIGN_FLOOR_CPS[1]}/s; here "
            f"{floor.rate:.1f}/s. The 8 clients and the scripted LLM run in the bench process, on "
            "the same cores as the servers."
        ],
    )
    table(
        "5c. Where the CPU went during each load window (cores busy on average)",
        ["", *CPU_GROUPS, "total"],
        [
            [label, *(f"{r.cores[g]:.2f}" for g in CPU_GROUPS), f"{sum(r.cores.values()):.2f}"]
            for label, r in (("floor", floor), ("SABRE", sabre))
        ],
        [
            f"The machine has {os.cpu_count()} cores. 'bench process' = the 8 HTTP clients + the "
            "scripted LLM; 'server' = the served process and its children (SABRE's sandbox workers)."
        ],
    )


# Main.


async def run(quick: bool, *, runtime_workers: int) -> None:
    n_turns = 30 if quick else 200
    per_k = 5 if quick else 20
    duration = 3.0 if quick else 10.0
    name = f"sabre_bench_{secrets.token_hex(4)}"
    base = ADMIN_DSN.rsplit("/", 1)[0]
    dsn = f"{base}/{name}"
    admin = await asyncpg.connect(ADMIN_DSN, timeout=5)
    servers: list[Server] = []
    responder = Responder()
    llm = ScriptedLLM(responder=responder)
    tmp = tempfile.TemporaryDirectory(prefix="sabre_bench_")
    bench: Bench | None = None
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        migrate_started = time.perf_counter()
        await upgrade("postgresql+asyncpg://" + dsn.split("://", 1)[1])
        migrate_seconds = time.perf_counter() - migrate_started
        llm.start()
        tmpdir = Path(tmp.name)
        sabre_port, floor_port = free_port(), free_port()
        sabre_env = clean_env(
            SABRE_DATABASE_URL=dsn,
            SABRE_REDIS_URL=REDIS_URL,
            OPENAI_BASE_URL=llm.base_url,
            OPENAI_API_KEY="sk-bench",
            SABRE_LLM_API="chat",
            SABRE_MODEL="scripted-model",
            SABRE_RUNTIME_WORKERS=str(runtime_workers),
            SABRE_DATA_DIR=str(tmpdir / "data"),
            HOME=str(tmpdir),
        )
        servers.append(
            launch(
                "sabre",
                [sys.executable, "-m", "app.cli", "serve", "--port", str(sabre_port)],
                sabre_env,
                sabre_port,
                tmpdir,
            )
        )
        servers.append(
            launch(
                "floor",
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "bench.floor_app:app",
                    "--port",
                    str(floor_port),
                    "--log-level",
                    "warning",
                ],
                clean_env(FLOOR_DATABASE_URL=dsn),
                floor_port,
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
            quick=quick,
            sabre_pid=servers[0].process.pid,
            floor_pid=servers[1].process.pid,
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
                ["database", f"`{name}` (fresh; migrated in {migrate_seconds:.2f} s; dropped at the end)"],
                [
                    "SABRE",
                    f"`python -m app.cli serve`, PostgreSQL + Redis, {runtime_workers} sandbox workers, "
                    "chat API",
                ],
                ["floor", "`uvicorn bench.floor_app:app`: FastAPI + 1 PG transaction (SQLAlchemy/asyncpg)"],
                ["model", "ScriptedLLM in the bench process, instant replies"],
                ["both ready after", f"{ready_seconds:.2f} s"],
            ],
        )
        async with httpx.AsyncClient(timeout=120) as client:
            floor_latencies = await floor_baseline(bench, client, n_turns)
            await turn_overhead(bench, client, n_turns)
            await snapshot_size(bench, client, dsn)
            await pause_resume(bench, client, per_k)
            await sequential_workload(bench, client, n_turns, floor_latencies)
        await concurrent_workload(bench, duration)
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
        with contextlib.suppress(Exception):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        tmp.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples and a shorter load test")
    parser.add_argument("--runtime-workers", type=int, default=2, help="SABRE_RUNTIME_WORKERS of the server")
    args = parser.parse_args()
    asyncio.run(run(args.quick, runtime_workers=args.runtime_workers))


if __name__ == "__main__":
    main()
