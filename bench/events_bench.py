"""SABRE events benchmark (issue 11): what a turn's events cost, how late a model delta reaches an SSE
client on another replica, and how many events per second cross replicas; one run, one machine,
markdown tables.

Run: ``uv run python bench/events_bench.py [--quick]``.

What it starts: a fresh PostgreSQL database (``sabre_bench_<hex>``, migrated, dropped at the end), a
ScriptedLLM inside this process (replies chosen from an ``[ev:...]`` tag in the user's message), and
three servers, each its own process:

- **A**: ``sabre serve`` on PostgreSQL + Redis; every timed turn runs here. It runs as
  ``python -m bench.sabre_events_off serve``: ``python -m app.cli serve`` plus a bench-only switch
  (signals) that turns its events off (not written, published or read; still collected in memory)
  for the blocks of section 2 that measure the service without them, so that comparison is made
  in one process. Everywhere else its events are on: the service's own code.
- **B**: a second ``python -m app.cli serve`` on the same store and Redis. It only serves the SSE
  followers (``GET /v1/conversations/{id}/events?follow=true``, ``Accept: text/event-stream``), so
  every event they get was committed by A and crossed replicas over Redis pub/sub.
- **floor**: ``bench/floor_app.py`` (FastAPI + one PostgreSQL transaction per request), DESIGN §9.

Sections: (2) per-request latency and CPU of the DESIGN §9 workload (message → model → block →
external tool → pause; resume → block ends → model → answer) on existing conversations, with events
switched off (0), with events and no subscriber (a), with an SSE follower on B per conversation (b),
streamed (c), and the floor, interleaved in blocks; (3) a paced reply (``Reply(chunk_delay=...)``):
the time from the scripted server's write of each chunk to the client's parse of the ``llm.delta``
that carries it, on B and on A's own streamed POST; (4) N concurrent turns on A, one follower per
conversation on B: events per second received at B and their lag; (5) what open followers hold on
their replica (PostgreSQL connections). Nothing is asserted; the machine is shared and noisy, so
ratios within the run are the figures to read.

The chunks' send times come from the ScriptedLLM running in this process: ``app.llm.scripted``'s
chat event generator is wrapped here (the handler thread stamps each event with ``perf_counter``
just before writing it) and the SSE clients stamp each parsed event with the same clock.

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
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from redis.asyncio import Redis
from sqlalchemy import select, text

import app.llm.scripted as scripted
from app.conversations.repository import ConversationRepository, _live_turn
from app.events.bus import RedisBus
from app.events.recorder import TurnRecorder
from app.events.repository import EventRepository
from app.kit.clock import utcnow
from app.kit.db import create_engine as create_db_engine
from app.kit.db import create_sessionmaker
from app.kit.migrate import upgrade
from app.llm.scripted import RecordedRequest, Reply, ScriptedLLM
from app.models import Conversation, Turn
from bench.service_bench import (
    ADMIN_DSN,
    ANSWER,
    GET_ORDER,
    REDIS_URL,
    TURN_BLOCK,
    WORK_BLOCK,
    Server,
    clean_env,
    free_port,
    launch,
    ms,
    pct,
    ratio,
    sabre_env,
    table,
    wait_ready,
)
from bench.service_bench import Responder as ServiceResponder

END_TYPES = frozenset({"turn.completed", "turn.awaiting_tool_results", "turn.failed", "turn.cancelled"})
SSE = {"Accept": "text/event-stream"}
CHUNK = 16  # characters per scripted chunk: chunk i is text[16 i : 16 (i + 1)]
FLUSH_SECONDS = 0.05  # SABRE_EVENTS_FLUSH_SECONDS's default, which the servers keep

# -- the scripted model --------------------------------------------------------------------------

TAG = re.compile(r"\[ev:(\w+)(?::([0-9a-f]+):(\d+):(\d+))?\]")


def delta_text(key: str, chunks: int) -> str:
    """``chunks`` pieces of CHUNK characters, each naming its turn and its index."""
    return "".join(f"{key}:{i:04d}".ljust(CHUNK, ".") for i in range(chunks))


class Responder:
    """Answer after a block ran; else the scenario of the last (or first) user message's tag:
    ``[ev:work]`` a block calling the external tool, ``[ev:turn]`` a block, ``[ev:delta:KEY:N:MS]`` a
    plain answer streamed as N chunks MS ms apart, anything else a plain answer."""

    def __call__(self, request: RecordedRequest) -> str | Reply:
        first, last = ServiceResponder._user_texts(request)
        if "<helpers_result>" in last:
            return ANSWER
        match = TAG.search(last) or TAG.search(first)
        if match is None:
            return ANSWER
        name = match.group(1)
        if name == "delta":
            key, chunks, delay = match.group(2), int(match.group(3)), int(match.group(4))
            return Reply(text=delta_text(key, chunks), chunk_size=CHUNK, chunk_delay=delay / 1000)
        code = {"turn": TURN_BLOCK, "work": WORK_BLOCK}.get(name)
        return ANSWER if code is None else f"<helpers>\n{code}\n</helpers>"


class SendTimes:
    """When the scripted server wrote each streamed chat event of a watched reply text.

    Wraps ``app.llm.scripted._chat_events`` (a private generator of the module, wrapped in this
    process only): the handler writes each event right after the generator yields it (a paced
    reply writes one event at a time), so the stamp taken at the yield is the write time to within
    microseconds. Event 0 is the role chunk, event i + 1 carries chunk i.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[str, list[float]] = {}
        self._original = scripted._chat_events

    def watch(self, text: str) -> list[float]:
        with self._lock:
            return self._watched.setdefault(text, [])

    def install(self) -> None:
        original, watched = self._original, self._watched

        def timed(text: str, *args: Any, **kwargs: Any) -> Iterator[bytes]:
            stamps = watched.get(text)
            for event in original(text, *args, **kwargs):
                if stamps is not None:
                    stamps.append(time.perf_counter())
                yield event

        scripted._chat_events = timed

    def uninstall(self) -> None:
        scripted._chat_events = self._original


# -- SSE clients -----------------------------------------------------------------------------


@dataclass
class Arrival:
    """One event as an SSE client parsed it."""

    seq: int
    type: str
    turn_id: str
    data: dict[str, Any]
    created: float  # the server's created_at, epoch seconds (same machine, same clock)
    at: float  # perf_counter() here, when parsed
    wall: float  # time.time() here, when parsed


async def sse_events(response: httpx.Response) -> AsyncIterator[Arrival]:
    """The events of an SSE response as they are parsed (the JSON ``data:`` carries seq and type)."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line:
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            continue  # id:, event:, comments (pings)
        if not data:
            continue
        item = json.loads("\n".join(data))
        data = []
        yield Arrival(
            seq=int(item["seq"]),
            type=item["type"],
            turn_id=item["turn_id"],
            data=item["data"],
            created=datetime.fromisoformat(item["created_at"]).timestamp(),
            at=time.perf_counter(),
            wall=time.time(),
        )


class Watcher:
    """``GET {base}/v1/conversations/{id}/events?follow=true`` as SSE, kept open, every event kept."""

    def __init__(self, client: httpx.AsyncClient, base: str, conversation: str) -> None:
        self.client = client
        self.url = f"{base}/v1/conversations/{conversation}/events"
        self.conversation = conversation
        self.arrivals: list[Arrival] = []
        self.ends: dict[str, float] = {}  # turn id → perf_counter() its end event was parsed
        self.ready = asyncio.Event()  # the replay began: the follower is subscribed
        self._changed = asyncio.Event()  # set at every event (and at the end)
        self.error: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            params = {"follow": "true", "after": "0"}
            async with self.client.stream("GET", self.url, params=params, headers=SSE) as response:
                if response.status_code != 200:
                    self.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                    return
                async for event in sse_events(response):
                    self.arrivals.append(event)
                    if event.type in END_TYPES:
                        self.ends[event.turn_id] = event.at
                    self.ready.set()
                    self._changed.set()
                self.error = "the stream ended"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.error = repr(exc)
        finally:
            self.ready.set()
            self._changed.set()

    async def wait_end(self, turn_id: str, within: float) -> bool:
        deadline = time.perf_counter() + within
        while turn_id not in self.ends and self.error is None:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return turn_id in self.ends

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def open_watchers(client: httpx.AsyncClient, base: str, conversations: list[str]) -> list[Watcher]:
    watchers = [Watcher(client, base, c) for c in conversations]
    for watcher in watchers:
        watcher.start()
    await asyncio.wait_for(asyncio.gather(*(w.ready.wait() for w in watchers)), timeout=60)
    broken = [w.error for w in watchers if w.error]
    if broken:
        raise RuntimeError(f"{len(broken)} watcher(s) failed: {broken[0]}")
    return watchers


def watcher_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(30, read=None),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
    )


# -- CPU by process group --------------------------------------------------------------------


def cpu_by_group(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far (user + system, reaped children included) of each root's process tree,
    of every ``postgres`` and ``redis-server`` process (shared with whatever else runs here) and of
    this process, read from /proc (Linux)."""
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
        stats[int(entry)] = (int(fields[1]), comm, sum(int(f) for f in fields[11:15]) / tick)
    owner: dict[int, str] = {pid: name for name, pid in roots.items()}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _, _) in stats.items():
            if ppid in owner and pid not in owner:
                owner[pid] = owner[ppid]
                grew = True
    totals = dict.fromkeys([*roots, "postgres", "redis", "bench"], 0.0)
    for pid, (_, comm, used) in stats.items():
        if pid in owner:
            totals[owner[pid]] += used
        elif pid == os.getpid():
            totals["bench"] += used
        elif comm == "postgres":
            totals["postgres"] += used
        elif comm.startswith("redis-server"):
            totals["redis"] += used
    return totals


def minus(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


# -- requests --------------------------------------------------------------------------------


@dataclass
class Req:
    """One timed request: its latency, the turn it ran, when its answer was complete."""

    latency: float
    turn_id: str
    done_at: float
    kind: str  # "message" or "resume"


@dataclass
class Ctx:
    a: str
    b: str
    floor: str
    pids: dict[str, int]
    dsn: str
    events_state: Path  # where A says whether its events are on (bench/sabre_events_off.py)
    errors: list[str] = field(default_factory=list)

    def error(self, message: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(message)

    async def switch_events(self, *, off: bool) -> None:
        """Switch A's events off (SIGUSR1) or on (SIGUSR2) and wait until A says so."""
        want = "off" if off else "on"
        if self.events_state.read_text() == want:
            return
        os.kill(self.pids["A"], signal.SIGUSR1 if off else signal.SIGUSR2)
        deadline = time.perf_counter() + 10
        while self.events_state.read_text() != want:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"A did not switch its events {want}")
            await asyncio.sleep(0.002)


async def post_json(
    ctx: Ctx, client: httpx.AsyncClient, url: str, body: dict[str, Any], expect: str
) -> tuple[float, dict[str, Any]] | None:
    started = time.perf_counter()
    response = await client.post(url, json=body)
    latency = time.perf_counter() - started
    if not response.is_success or response.json().get("status") != expect:
        ctx.error(f"expected {expect}: HTTP {response.status_code} {response.text[:300]}")
        return None
    return latency, response.json()


async def post_streamed(
    ctx: Ctx, client: httpx.AsyncClient, url: str, body: dict[str, Any], expect: str
) -> tuple[float, dict[str, Any], list[Arrival]] | None:
    """A ``stream: true`` POST read to its end event: (latency to the end event, the Turn, events)."""
    started = time.perf_counter()
    arrivals: list[Arrival] = []
    async with client.stream("POST", url, json={**body, "stream": True}, headers=SSE) as response:
        if not response.is_success:
            ctx.error(f"expected {expect} (streamed): HTTP {response.status_code} {await response.aread()!r}")
            return None
        async for event in sse_events(response):
            arrivals.append(event)
            if event.type in END_TYPES:
                break
    latency = time.perf_counter() - started
    if not arrivals or arrivals[-1].data.get("status") != expect:
        ctx.error(f"expected {expect} (streamed): {[e.type for e in arrivals][-3:]}")
        return None
    return latency, arrivals[-1].data, arrivals


def resume_body(turn: dict[str, Any]) -> dict[str, Any]:
    call = turn["pending_tool_calls"][0]
    return {"results": [{"tool_call_id": call["id"], "output": {"status": "shipped"}}]}


async def work_pair(
    ctx: Ctx, client: httpx.AsyncClient, base: str, conversation: str, *, stream: bool = False
) -> list[Req] | None:
    """The DESIGN §9 pair on an existing conversation: message (→ model → block → external tool →
    pause), then resume (→ block ends → model → answer)."""
    url = f"{base}/v1/conversations/{conversation}"
    out: list[Req] = []
    turn: dict[str, Any] = {}
    for kind, path, body, expect in (
        ("message", "/messages", {"input": "again"}, "awaiting_tool_results"),
        ("resume", "/tool-results", None, "completed"),
    ):
        body = body if body is not None else resume_body(turn)
        if stream:
            streamed = await post_streamed(ctx, client, url + path, body, expect)
            if streamed is None:
                return None
            latency, turn, _ = streamed
        else:
            done = await post_json(ctx, client, url + path, body, expect)
            if done is None:
                return None
            latency, turn = done
        out.append(Req(latency, turn["turn_id"], time.perf_counter(), kind))
    return out


async def floor_pair(ctx: Ctx, client: httpx.AsyncClient, base: str, conversation: str) -> list[Req] | None:
    out: list[Req] = []
    for kind in ("message", "resume"):
        started = time.perf_counter()
        response = await client.post(f"{base}/items", json={"conversation": conversation, "body": kind})
        if not response.is_success:
            ctx.error(f"floor: HTTP {response.status_code} {response.text[:200]}")
            return None
        out.append(Req(time.perf_counter() - started, "", time.perf_counter(), kind))
    return out


async def create(ctx: Ctx, client: httpx.AsyncClient, base: str, tag: str, *, tools: bool) -> str:
    """A conversation with one turn done (and its pause resumed, for a tool-calling one)."""
    body: dict[str, Any] = {"input": f"[ev:{tag}] please"}
    if tools:
        body["tools"] = [GET_ORDER]
    response = await client.post(f"{base}/v1/conversations", json=body)
    response.raise_for_status()
    turn = response.json()
    if turn["status"] == "awaiting_tool_results":
        resumed = await client.post(
            f"{base}/v1/conversations/{turn['conversation_id']}/tool-results", json=resume_body(turn)
        )
        resumed.raise_for_status()
    return str(turn["conversation_id"])


async def create_many(ctx: Ctx, base: str, tag: str, n: int, *, tools: bool) -> list[str]:
    gate = asyncio.Semaphore(4)
    async with httpx.AsyncClient(timeout=120) as client:

        async def one() -> str:
            async with gate:
                return await create(ctx, client, base, tag, tools=tools)

        return list(await asyncio.gather(*(one() for _ in range(n))))


# -- 2. per-request cost ---------------------------------------------------------------------


@dataclass
class Condition:
    label: str
    server: str  # the group in cpu_by_group that runs its requests
    run: Callable[[httpx.AsyncClient, str], Awaitable[list[Req] | None]]
    conversations: list[str]
    events_off: bool = False
    requests: list[Req] = field(default_factory=list)
    pairs: int = 0
    cpu: dict[str, float] = field(default_factory=dict)
    watchers: list[Watcher] = field(default_factory=list)

    def p50(self, kind: str | None = None) -> float:
        return pct([r.latency for r in self.requests if kind in (None, r.kind)], 50)

    def cpu_per_request(self, group: str) -> float:
        return self.cpu.get(group, 0.0) / max(len(self.requests), 1)


async def per_request_cost(ctx: Ctx, *, rounds: int, block: int, per_condition: int) -> None:
    """Blocks of ``block`` pairs per condition, the order of the conditions rotating each round;
    the first round is a warm-up. A's events are switched off for the blocks that want them off,
    and on again after. CPU is read around each block."""
    off_convs, a_convs, b_convs, c_convs = await asyncio.gather(
        *(create_many(ctx, ctx.a, "work", per_condition, tools=True) for _ in range(4))
    )
    watch_http = watcher_client()
    conditions = [
        Condition(
            "floor: FastAPI + 1 PG transaction",
            "floor",
            lambda c, conv: floor_pair(ctx, c, ctx.floor, conv),
            [secrets.token_hex(8) for _ in range(per_condition)],
        ),
        Condition(
            "(0) SABRE, events switched off",
            "A",
            lambda c, conv: work_pair(ctx, c, ctx.a, conv),
            off_convs,
            events_off=True,
        ),
        Condition(
            "(a) SABRE, events, no subscriber",
            "A",
            lambda c, conv: work_pair(ctx, c, ctx.a, conv),
            a_convs,
        ),
        Condition(
            "(b) SABRE, events, SSE follower on B",
            "A",
            lambda c, conv: work_pair(ctx, c, ctx.a, conv),
            b_convs,
        ),
        Condition(
            "(c) SABRE, `stream: true` POSTs",
            "A",
            lambda c, conv: work_pair(ctx, c, ctx.a, conv, stream=True),
            c_convs,
        ),
    ]
    floor, off, base, follow, _ = conditions
    try:
        follow.watchers = await open_watchers(watch_http, ctx.b, follow.conversations)
        roots = {k: ctx.pids[k] for k in ("floor", "A", "B")}
        async with httpx.AsyncClient(timeout=120) as client:
            for round_ in range(rounds + 1):
                shift = round_ % len(conditions)
                for condition in conditions[shift:] + conditions[:shift]:
                    if condition.server == "A":
                        await ctx.switch_events(off=condition.events_off)
                    before = cpu_by_group(roots)
                    pairs: list[list[Req]] = []
                    for i in range(block):
                        conversation = condition.conversations[(round_ * block + i) % per_condition]
                        pair = await condition.run(client, conversation)
                        if pair is not None:
                            pairs.append(pair)
                    used = minus(cpu_by_group(roots), before)
                    if round_ == 0:
                        continue  # warm-up
                    condition.pairs += len(pairs)
                    condition.requests.extend(r for pair in pairs for r in pair)
                    for group, seconds in used.items():
                        condition.cpu[group] = condition.cpu.get(group, 0.0) + seconds
        await ctx.switch_events(off=False)
        # Did every event of the followed conversations reach B's followers? (1 s to catch up.)
        await asyncio.sleep(1.0)
        stored = await stored_counts(ctx, follow.conversations)
        received = {w.conversation: len({e.seq for e in w.arrivals}) for w in follow.watchers}
    finally:
        for watcher in follow.watchers:
            await watcher.stop()
        await watch_http.aclose()

    f50, a50 = floor.p50(), base.p50()
    a90 = pct([r.latency for r in base.requests], 90)
    rows = []
    for condition in conditions:
        lat = [r.latency for r in condition.requests]
        p50, p90 = pct(lat, 50), pct(lat, 90)
        sabre = condition.server != "floor"
        rows.append(
            [
                condition.label,
                len(lat),
                ms(p50),
                ms(p90),
                ms(condition.p50("message")),
                ms(condition.p50("resume")),
                ratio(p50, f50),
                ratio(p50, a50) if sabre else "",
                ratio(p90, a90) if sabre else "",
                ms(condition.cpu_per_request(condition.server)),
            ]
        )
    # End events at B's followers, against the POST's answer on A.
    seen_at = {t: at for w in follow.watchers for t, at in w.ends.items()}
    ends = [seen_at[r.turn_id] - r.done_at for r in follow.requests if r.turn_id in seen_at]
    missing = sum(max(0, stored[c] - received.get(c, 0)) for c in stored)
    off50, b50 = off.p50(), follow.p50()
    cpu_off, cpu_a = off.cpu_per_request("A"), base.cpu_per_request("A")
    table(
        f"2. Cost of events on a turn: the DESIGN §9 pair on existing conversations, {rounds} rounds x "
        f"{block} pairs per condition, sequential, interleaved",
        [
            "",
            "requests",
            "p50 ms",
            "p90 ms",
            "message p50 ms",
            "resume p50 ms",
            "p50 / floor",
            "p50 / (a)",
            "p90 / (a)",
            "server CPU ms / request",
        ],
        rows,
        [
            "message = POST .../messages (→ model → block → external tool → pause); resume = POST "
            ".../tool-results (→ block ends → model → answer); each pair on one of "
            f"{per_condition} conversations per condition (created and warmed up first, so every "
            f"condition's conversations grow alike). Conditions run in blocks of {block} pairs, their "
            "order rotating each round; round 0 (a warm-up) is dropped. All SABRE conditions run on "
            "the same process A: (0) with its events switched off for its blocks "
            "(bench/sabre_events_off.py: not written, published or read; still collected in memory). "
            "(b): each of its conversations has a `GET .../events?follow=true` SSE stream open on "
            "replica B for the whole run, read as fast as it comes. (c): the same POSTs with "
            "`stream: true` (a task of A runs the turn; latency = until the end event is parsed). "
            "Server CPU: A's process tree (or the floor's) in the condition's blocks, per request.",
            f"**Events (a) vs switched off (0): p50 {ratio(a50, off50)} ({ms(a50 - off50)} ms), "
            f"server CPU {ratio(cpu_a, cpu_off)} ({ms(cpu_a - cpu_off)} ms a request)**; **an SSE "
            f"follower (b) vs (a): p50 {ratio(b50, a50)}**. DESIGN §9 budgets: events ≤ 5% of a turn; "
            f"each request p50 ≤ 3x the floor (here (a) {ratio(a50, f50)}, (b) {ratio(b50, f50)}).",
            f"(b)'s followers on B: the end event of a turn arrived p50 {ms(pct(ends, 50))} ms / p90 "
            f"{ms(pct(ends, 90))} ms / max {ms(max(ends, default=float('nan')))} ms after its POST "
            f"answered on A (n={len(ends)}); events stored on those conversations but never received "
            f"by their follower: {missing} (of {sum(stored.values())}).",
        ],
    )
    groups = ["server", "B", "postgres", "redis"]
    cpu_rows = []
    for condition in conditions:
        per_pair = {
            "server": condition.cpu.get(condition.server, 0.0),
            "B": condition.cpu.get("B", 0.0),
            "postgres": condition.cpu.get("postgres", 0.0),
            "redis": condition.cpu.get("redis", 0.0),
        }
        n = max(condition.pairs, 1)
        cpu_rows.append(
            [
                condition.label,
                condition.pairs,
                *(f"{per_pair[g] / n * 1000:.1f}" for g in groups),
                f"{sum(per_pair.values()) / n * 1000:.1f}",
            ]
        )
    table(
        "2b. CPU per pair (2 requests) in each condition's blocks, ms",
        ["", "pairs", "server (A or floor)", "B", "postgres", "redis", "total"],
        cpu_rows,
        [
            "CPU time from /proc (10 ms ticks) around each block: the server's process tree (its "
            "sandbox workers included), replica B, every postgres and redis-server process of the "
            "machine (shared with anything else running here, so noisy), divided by the pairs run."
        ],
    )
    write_rows = []
    for condition in conditions[1:]:
        writes = await turn_writes(ctx, [r.turn_id for r in condition.requests])
        row: list[object] = [condition.label]
        for kind in ("message", "resume"):
            reqs = [r for r in condition.requests if r.kind == kind]
            counts = [writes[r.turn_id] for r in reqs]
            n = max(len(counts), 1)
            row += [
                ms(condition.p50(kind)),
                f"{sum(c[0] for c in counts) / n:.1f}",
                f"{sum(c[1] for c in counts) / n:.2f}",
                f"{sum(c[1] > 1 for c in counts) / n:.0%}",
            ]
        write_rows.append(row)
    table(
        "2c. What the timed turns wrote: events and the transactions that wrote them (mean per turn)",
        [
            "",
            "message p50 ms",
            "events",
            "event txns",
            "with a flush",
            "resume p50 ms",
            "events",
            "event txns",
            "with a flush",
        ],
        write_rows,
        [
            "From the store after the run: events per turn, and the distinct `xmin` (inserting "
            "transaction) of its event rows: 1 = all in the turn's final transaction; each more is a "
            f"flush transaction of its own, taken when the turn outlives the {FLUSH_SECONDS * 1000:.0f} ms "
            "flush interval. 'with a flush': the share of turns that took at least one. (0) stores "
            "none. (c)'s turns also commit `turn.started` with the queued turn before they run."
        ],
    )


async def recorder_parts(ctx: Ctx, *, iterations: int) -> None:
    """The events' share of a turn, part by part: the app's own TurnRecorder, EventRepository and
    RedisBus run in this process against the bench database and Redis, on a turn's real events."""
    async with httpx.AsyncClient(timeout=120) as client:
        conversation = await create(ctx, client, ctx.a, "plain", tools=False)
    raw = await asyncpg.connect(ctx.dsn, timeout=5)
    try:
        turn_id = await raw.fetchval(
            "SELECT turn_id FROM events WHERE type = 'turn.completed' AND data->>'status' = 'completed' "
            "AND turn_id IN (SELECT turn_id FROM events WHERE type = 'block.completed') "
            "ORDER BY seq DESC LIMIT 1"
        )
        template = [
            (r["type"], json.loads(r["data"]) if isinstance(r["data"], str) else r["data"])
            for r in await raw.fetch("SELECT type, data FROM events WHERE turn_id = $1 ORDER BY seq", turn_id)
        ]
        last = int(await raw.fetchval("SELECT max(seq) FROM events WHERE conversation_id = $1", conversation))
    finally:
        await raw.close()
    engine = create_db_engine("postgresql+asyncpg://" + ctx.dsn.split("://", 1)[1])
    maker = create_sessionmaker(engine)
    redis = Redis.from_url(REDIS_URL)
    bus = RedisBus(redis)
    touch = text("UPDATE conversations SET updated_at = updated_at WHERE id = :id")
    variants = ("tx", "tx + turn_state", "tx + turn_state w/o seq", "tx + last_seq", "tx + events INSERT")
    parts: dict[str, tuple[list[float], list[float]]] = {
        k: ([], []) for k in ("emit", *variants, "publish", "flush")
    }
    delta = delta_text("abcdef", 10)  # 160 characters: a flush window's worth of a fast model

    def clocks() -> tuple[float, float]:
        return time.perf_counter(), time.thread_time()

    def add(part: str, since: tuple[float, float]) -> None:
        now = clocks()
        parts[part][0].append(now[0] - since[0])
        parts[part][1].append(now[1] - since[1])

    try:
        for i in range(iterations + 20):  # the first 20 warm up
            recorder = TurnRecorder(
                conversation_id=conversation,
                turn_id=f"bench_{secrets.token_hex(8)}",
                next_seq=last + 1,
                bus=bus,
                sessionmaker=None,
            )
            started = clocks()
            for type_, data in template:
                recorder.emit(type_, data)
            emitted = clocks()
            for part in variants[i % len(variants) :] + variants[: i % len(variants)]:
                began = clocks()
                async with maker() as session, session.begin():
                    await session.execute(touch, {"id": conversation})
                    if part == "tx + turn_state":
                        await ConversationRepository(session).turn_state(
                            conversation_id=conversation, now=utcnow()
                        )
                    elif part == "tx + turn_state w/o seq":
                        await session.execute(state_without_seq(conversation))
                    elif part == "tx + last_seq":
                        await EventRepository(session).last_seq(conversation_id=conversation)
                    elif part == "tx + events INSERT":
                        rows = await recorder.drain(session)
                if i >= 20:
                    add(part, began)
            began = clocks()
            await recorder.publish(rows)
            if i >= 20:
                add("publish", began)
                parts["emit"][0].append(emitted[0] - started[0])
                parts["emit"][1].append(emitted[1] - started[1])
            # A flush while a turn streams: one coalesced llm.delta in a transaction of its own.
            recorder.emit("llm.delta", {"text": delta})
            began = clocks()
            async with maker() as session, session.begin():
                flushed = await recorder.drain(session)
            await recorder.publish(flushed)
            if i >= 20:
                add("flush", began)
            last = recorder.next_seq - 1
    finally:
        await bus.aclose()
        await redis.aclose()
        await engine.dispose()

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")

    def cost(part: str, base: str | None) -> tuple[float, float]:
        wall = pct(parts[part][0], 50) - (pct(parts[base][0], 50) if base else 0.0)
        return wall, mean(parts[part][1]) - (mean(parts[base][1]) if base else 0.0)

    tx_wall, tx_cpu = cost("tx", None)
    rows_out: list[list[object]] = []
    total_wall = total_cpu = 0.0
    for label, part, base in (
        (f"emit() x {len(template)} (the turn's events, in memory)", "emit", None),
        (
            "its last seq: a subquery of the turn's state statement (turn_state, with vs without it)",
            "tx + turn_state",
            "tx + turn_state w/o seq",
        ),
        (f"INSERT of the {len(template)} events, in its final transaction", "tx + events INSERT", "tx"),
        ("publish (encode + Redis PUBLISH)", "publish", None),
    ):
        wall, cpu = cost(part, base)
        total_wall += wall
        total_cpu += cpu
        rows_out.append([label, ms(wall), ms(cpu)])
    rows_out.append(
        ["**sum: the events of one waited turn**", f"**{ms(total_wall)}**", f"**{ms(total_cpu)}**"]
    )
    wall, cpu = cost("tx + last_seq", "tx")
    rows_out.append(
        ["streamed or background turns: their last seq by a query of its own (last_seq)", ms(wall), ms(cpu)]
    )
    rows_out.append(
        [
            "while a turn streams, every flush window: BEGIN, INSERT 1 llm.delta, COMMIT + publish",
            ms(pct(parts["flush"][0], 50)),
            ms(mean(parts["flush"][1])),
        ]
    )
    rows_out.append(
        ["reference: a transaction with one UPDATE (BEGIN, UPDATE, COMMIT)", ms(tx_wall), ms(tx_cpu)]
    )
    table(
        f"2d. The events' work for one turn, part by part ({iterations} turns, the app's own code in "
        "this process)",
        ["part", "wall p50 ms", "CPU ms (mean, this thread)"],
        rows_out,
        [
            "TurnRecorder, EventRepository, ConversationRepository.turn_state and RedisBus from app/, "
            f"run here on the events of a real turn of section 2 ({len(template)} events: "
            f"{', '.join(t for t, _ in template)}), appended to a conversation of the bench database. "
            "The seq reads and the INSERT are measured as the difference between a transaction "
            "(BEGIN, UPDATE conversations, COMMIT) with and without them, as they ride in the turn's "
            "own transactions (the variants' order rotates). CPU: this thread's CPU time (Python: "
            "SQLAlchemy, asyncpg, redis-py; not PostgreSQL's or Redis's). A turn shorter than the "
            "flush interval pays the sum once; a longer one also pays a flush transaction per flush "
            "window (section 3: about 17 a second while the model streams)."
        ],
    )


def state_without_seq(conversation_id: str) -> Any:
    """ConversationRepository.turn_state's statement without its last-seq subquery."""
    active = select(Turn.id).where(Turn.conversation_id == conversation_id, _live_turn(utcnow())).exists()
    return select(Conversation.version, active).where(Conversation.id == conversation_id)


async def stored_counts(ctx: Ctx, conversations: list[str]) -> dict[str, int]:
    connection = await asyncpg.connect(ctx.dsn, timeout=5)
    try:
        rows = await connection.fetch(
            "SELECT conversation_id, count(*) AS n FROM events WHERE conversation_id = ANY($1::text[]) "
            "GROUP BY conversation_id",
            conversations,
        )
    finally:
        await connection.close()
    return {c: 0 for c in conversations} | {row["conversation_id"]: int(row["n"]) for row in rows}


async def turn_writes(ctx: Ctx, turn_ids: list[str]) -> dict[str, tuple[int, int]]:
    """Per turn: (events stored, transactions that wrote them). A row's ``xmin`` is the id of the
    transaction that inserted it, so distinct xmins are the flushes plus the turn's final commit."""
    connection = await asyncpg.connect(ctx.dsn, timeout=5)
    try:
        rows = await connection.fetch(
            "SELECT turn_id, count(*) AS n, count(DISTINCT xmin::text) AS tx FROM events "
            "WHERE turn_id = ANY($1::text[]) GROUP BY turn_id",
            turn_ids,
        )
    finally:
        await connection.close()
    return {t: (0, 0) for t in turn_ids} | {r["turn_id"]: (int(r["n"]), int(r["tx"])) for r in rows}


# -- 3. delta latency ------------------------------------------------------------------------


@dataclass
class DeltaStats:
    chunk: list[float] = field(default_factory=list)  # per chunk: parsed here - written by the model
    oldest: list[float] = field(default_factory=list)  # per llm.delta event, from its first chunk
    newest: list[float] = field(default_factory=list)  # per llm.delta event, from its last chunk
    first: list[float] = field(default_factory=list)  # per turn: chunk 0 written → its event parsed
    events: int = 0
    turns: int = 0
    wrong_text: int = 0

    def add(self, arrivals: list[Arrival], turn_id: str, text: str, sent: list[float]) -> None:
        """Match the turn's llm.delta events to the chunks they carry (by the text's length so far)."""
        chunk_sent = sent[1 : 1 + len(text) // CHUNK]  # event 0 is the role chunk
        got = ""
        self.turns += 1
        for event in arrivals:
            if event.turn_id != turn_id or event.type != "llm.delta":
                continue
            start = len(got) // CHUNK
            got += event.data["text"]
            end = min(len(got) // CHUNK, len(chunk_sent))  # chunks complete with this event
            if end <= start:
                continue
            self.events += 1
            latencies = [event.at - chunk_sent[i] for i in range(start, end)]
            self.chunk.extend(latencies)
            self.oldest.append(latencies[0])
            self.newest.append(latencies[-1])
            if start == 0:
                self.first.append(latencies[0])
        if got != text:
            self.wrong_text += 1


async def delta_latency(ctx: Ctx, times: SendTimes, *, turns: int, chunks: int, delay_ms: int) -> None:
    watch_http = watcher_client()
    on_b, on_a = DeltaStats(), DeltaStats()
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            conversation = await create(ctx, client, ctx.a, "plain", tools=False)
            (watcher,) = await open_watchers(watch_http, ctx.b, [conversation])
            for turn in range(turns + 1):  # turn 0 is a warm-up
                key = secrets.token_hex(3)
                text = delta_text(key, chunks)
                sent = times.watch(text)
                url = f"{ctx.a}/v1/conversations/{conversation}/messages"
                body = {"input": f"[ev:delta:{key}:{chunks}:{delay_ms}] go"}
                streamed = await post_streamed(ctx, client, url, body, "completed")
                if streamed is None:
                    continue
                _, turn_out, arrivals = streamed
                turn_id = turn_out["turn_id"]
                if not await watcher.wait_end(turn_id, within=10):
                    ctx.error(f"delta: B's follower never saw the end of {turn_id}: {watcher.error}")
                    continue
                if len(sent) < chunks + 1:
                    ctx.error(f"delta: the scripted server stamped {len(sent)} events, not {chunks + 1}")
                    continue
                if turn == 0:
                    continue
                on_a.add(arrivals, turn_id, text, sent)
                on_b.add(watcher.arrivals, turn_id, text, sent)
            await watcher.stop()
    finally:
        await watch_http.aclose()

    def row(label: str, s: DeltaStats) -> list[object]:
        return [
            label,
            len(s.chunk),
            ms(pct(s.chunk, 50)),
            ms(pct(s.chunk, 90)),
            ms(max(s.chunk, default=float("nan"))),
            f"{s.events / max(s.turns, 1):.1f}",
            ms(pct(s.oldest, 50)),
            ms(pct(s.oldest, 90)),
            ms(max(s.oldest, default=float("nan"))),
            ms(pct(s.newest, 50)),
            ms(pct(s.first, 50)),
            s.wrong_text,
        ]

    table(
        f"3. From a model delta to the SSE client: {turns} turns, each one answer of {chunks} chunks "
        f"written {delay_ms} ms apart (a {chunks * delay_ms / 1000:g} s stream), run on A",
        [
            "client",
            "chunks",
            "per chunk p50 ms",
            "p90 ms",
            "max ms",
            "llm.delta events / turn",
            "per event, oldest chunk p50 ms",
            "p90 ms",
            "max ms",
            "per event, newest chunk p50 ms",
            "first chunk ms (p50)",
            "text wrong",
        ],
        [
            row("B: GET .../events?follow=true (other replica, over Redis)", on_b),
            row("A: the POST's own stream (`stream: true`)", on_a),
        ],
        [
            "Per chunk: from the scripted server's write of the chunk (stamped in its handler thread, "
            "in this process) to the parse of the llm.delta event that carries it by an SSE client in "
            "this process (same clock, time.perf_counter). A's recorder coalesces the deltas of one "
            f"flush window ({FLUSH_SECONDS * 1000:.0f} ms) into one event, so a chunk waits between 0 and "
            "one window for the flush, then its transaction's commit and the Redis hop: 'oldest "
            "chunk' is the first chunk an event carries (≈ a full window + commit + delivery), "
            "'newest chunk' the last (≈ commit + delivery + the 0 to one chunk interval it was "
            "written before the flush began). A window starts when the previous flush has finished, "
            "so a flush comes every interval + its own transaction (hence fewer events than "
            "stream seconds / interval). 'text wrong': turns whose deltas did not add up to the text "
            "sent. Turn 0 is a warm-up, dropped.",
        ],
    )


# -- 4. events per second across replicas ----------------------------------------------------


@dataclass
class RateRun:
    clients: int
    watched: bool
    seconds: float
    turns: int
    events: int
    lags: list[float]
    end_lags: list[float]
    missing: int
    stored: int
    writes: list[tuple[int, int]]
    failures: int
    latencies: list[float]
    cores: dict[str, float]


async def rate_run(ctx: Ctx, *, clients: int, watched: bool, warmup: float, duration: float) -> RateRun:
    conversations = await create_many(ctx, ctx.a, "turn", clients, tools=False)
    watch_http = watcher_client()
    watchers: list[Watcher] = []
    done: list[Req] = []
    failures = 0
    roots = {"A": ctx.pids["A"], "B": ctx.pids["B"]}
    try:
        if watched:
            watchers = await open_watchers(watch_http, ctx.b, conversations)
        start = time.perf_counter()
        window = (start + warmup, start + warmup + duration)

        async def loop(conversation: str) -> None:
            nonlocal failures
            async with httpx.AsyncClient(timeout=120) as client:
                url = f"{ctx.a}/v1/conversations/{conversation}/messages"
                while time.perf_counter() < window[1]:
                    answered = await post_json(ctx, client, url, {"input": "again"}, "completed")
                    if answered is None:
                        failures += 1
                        continue
                    latency, turn = answered
                    done.append(Req(latency, turn["turn_id"], time.perf_counter(), "message"))

        async def sample() -> dict[str, float]:
            await asyncio.sleep(max(0.0, window[0] - time.perf_counter()))
            before, began = cpu_by_group(roots), time.perf_counter()
            await asyncio.sleep(max(0.0, window[1] - time.perf_counter()))
            used, elapsed = minus(cpu_by_group(roots), before), time.perf_counter() - began
            return {k: v / elapsed for k, v in used.items()}

        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(loop(c) for c in conversations))
        cores = await sampler
        in_window = [r for r in done if window[0] <= r.done_at <= window[1]]
        events = 0
        lags: list[float] = []
        end_lags: list[float] = []
        missing = stored_total = 0
        if watched:  # let the followers catch up with the last turns
            last_turns = {r.turn_id for r in done}
            deadline = time.perf_counter() + 15
            while time.perf_counter() < deadline:
                seen = set().union(*(w.ends for w in watchers))
                if last_turns <= seen:
                    break
                await asyncio.sleep(0.05)
            for watcher in watchers:
                for event in watcher.arrivals:
                    if window[0] <= event.at <= window[1]:
                        events += 1
                        lags.append(event.wall - event.created)
            ends = {t: at for w in watchers for t, at in w.ends.items()}
            end_lags = [ends[r.turn_id] - r.done_at for r in in_window if r.turn_id in ends]
            stored = await stored_counts(ctx, conversations)
            received = {w.conversation: len({e.seq for e in w.arrivals}) for w in watchers}
            missing = sum(max(0, stored[c] - received[c]) for c in conversations)
            stored_total = sum(stored.values())
        writes = await turn_writes(ctx, [r.turn_id for r in in_window])
    finally:
        for watcher in watchers:
            await watcher.stop()
        await watch_http.aclose()
    return RateRun(
        clients=clients,
        watched=watched,
        seconds=duration,
        turns=len(in_window),
        events=events,
        lags=lags,
        end_lags=end_lags,
        missing=missing,
        stored=stored_total,
        writes=list(writes.values()),
        failures=failures,
        latencies=[r.latency for r in in_window],
        cores=cores,
    )


async def events_per_second(ctx: Ctx, *, sizes: list[int], reps: int, warmup: float, duration: float) -> None:
    runs: list[RateRun] = []
    for clients in sizes:
        for rep in range(reps):  # alternate, and start with the other one on the next repetition
            for watched in (False, True) if rep % 2 == 0 else (True, False):
                runs.append(
                    await rate_run(ctx, clients=clients, watched=watched, warmup=warmup, duration=duration)
                )
    runs.sort(key=lambda r: (r.clients, r.watched))
    rows = []
    for run in runs:
        watched = run.watched
        rows.append(
            [
                run.clients,
                f"{run.clients} on B" if watched else "none",
                f"{run.turns / run.seconds:.1f}",
                ms(pct(run.latencies, 50)),
                f"{sum(w[1] for w in run.writes) / max(len(run.writes), 1):.2f}",
                f"{run.events / run.seconds:.0f}" if watched else "",
                f"{run.events / max(run.turns, 1):.1f}" if watched else "",
                ms(pct(run.lags, 50)) if watched else "",
                ms(pct(run.lags, 90)) if watched else "",
                ms(max(run.lags, default=float("nan"))) if watched else "",
                ms(pct(run.end_lags, 50)) if watched else "",
                ms(pct(run.end_lags, 90)) if watched else "",
                f"{run.missing}/{run.stored}" if watched else "",
                run.failures,
            ]
        )
    table(
        f"4. Events per second across replicas: N clients each running back-to-back turns on A "
        f"(one conversation each), {duration:g} s after {warmup:g} s warm-up, {reps} run(s) of each "
        "kind, alternated",
        [
            "N",
            "followers",
            "turns/s on A",
            "turn p50 ms",
            "event txns / turn",
            "events/s at B",
            "events / turn",
            "lag p50 ms",
            "lag p90 ms",
            "lag max ms",
            "end event after POST p50 ms",
            "p90 ms",
            "missed / stored",
            "failed",
        ],
        rows,
        [
            "A turn: POST .../messages (waited) → model → block `x = 1; print(x)` → model → answer; "
            "instant model. Followers: one `GET .../events?follow=true` SSE stream per conversation, "
            "on B. events/s: events parsed by all followers inside the window. Lag: parse time at the "
            "follower minus the event's created_at (the server's clock when the event was recorded; "
            "same machine), so it includes the wait for the flush or for the end of the turn. End "
            "event after POST: the follower's parse of a turn's end event minus the moment A's POST "
            "answered (negative: B was first). Event txns / turn: transactions that wrote the "
            "turn's events (1 = only its final one; see 2c). missed / stored: events in the store "
            "that a follower never got, after it was given up to 15 s to catch up.",
        ],
    )
    table(
        "4b. Where the CPU went during each window (cores busy on average)",
        ["N", "followers", "A", "B", "postgres", "redis", "bench (clients + model)", "total", "B µs / event"],
        [
            [
                run.clients,
                "on B" if run.watched else "none",
                *(f"{run.cores[g]:.2f}" for g in ("A", "B", "postgres", "redis", "bench")),
                f"{sum(run.cores.values()):.2f}",
                f"{run.cores['B'] * run.seconds / run.events * 1e6:.0f}" if run.events else "",
            ]
            for run in runs
        ],
        [
            f"The machine has {os.cpu_count()} cores; postgres and redis are every such process here. "
            "B CPU per event: B's CPU in the window over the events its followers parsed in it."
        ],
    )


# -- 5. what an open follower holds ------------------------------------------------------------

POOL = (20, 10)  # app.kit.db.create_engine: pool_size, max_overflow (a PostgreSQL store, per process)


async def idle_in_transaction(ctx: Ctx, older_than: float) -> tuple[int, float]:
    """Connections to the bench database idle inside a transaction begun more than ``older_than``
    seconds ago, and the oldest such transaction's age in seconds."""
    connection = await asyncpg.connect(ctx.dsn, timeout=5)
    try:
        row = await connection.fetchrow(
            "SELECT count(*) AS n, coalesce(max(extract(epoch FROM now() - xact_start)), 0) AS oldest "
            "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND state = 'idle in transaction' AND now() - xact_start > make_interval(secs => $1)",
            older_than,
        )
    finally:
        await connection.close()
    assert row is not None
    return int(row["n"]), float(row["oldest"])


async def follower_holdings(ctx: Ctx, *, steps: list[int]) -> None:
    """Open followers on B one at a time; at each step, count the connections idle in a
    transaction and time a plain GET on B (3 s timeout)."""
    conversations = await create_many(ctx, ctx.a, "plain", max(steps), tools=False)
    http = watcher_client()
    watchers: list[Watcher] = []
    rows: list[list[object]] = []
    try:
        async with httpx.AsyncClient(timeout=3) as client:
            for k in steps:
                not_open = 0
                while len(watchers) < k:
                    watcher = Watcher(http, ctx.b, conversations[len(watchers)])
                    watcher.start()
                    watchers.append(watcher)
                    try:
                        await asyncio.wait_for(watcher.ready.wait(), timeout=5)
                    except TimeoutError:
                        not_open += 1
                    if watcher.error:
                        not_open += 1
                await asyncio.sleep(0.6)
                held, oldest = await idle_in_transaction(ctx, older_than=0.5)
                latencies: list[float] = []
                timed_out = False
                for _ in range(5):
                    started = time.perf_counter()
                    try:
                        response = await client.get(f"{ctx.b}/v1/conversations/{conversations[0]}")
                        response.raise_for_status()
                    except httpx.TimeoutException:
                        timed_out = True
                        break
                    latencies.append(time.perf_counter() - started)
                rows.append(
                    [
                        k,
                        f"{k - not_open} / {k}",
                        held,
                        f"{oldest:.1f}",
                        "timed out (3 s)" if timed_out else ms(pct(latencies, 50)),
                    ]
                )
                if timed_out:
                    break
    finally:
        for watcher in watchers:
            await watcher.stop()
        await http.aclose()
    table(
        "5. What an open SSE follower holds on its replica: followers opened one at a time on B",
        [
            "followers asked for",
            "open (first event within 5 s)",
            "PG connections idle in transaction > 0.5 s",
            "oldest such transaction s",
            "GET /v1/conversations/{id} on B, p50 ms",
        ],
        rows,
        [
            "Counted in pg_stat_activity of the bench database (A and B both use it). B's pool "
            f"(app.kit.db.create_engine) holds {POOL[0]} + {POOL[1]} overflow connections and waits 30 s "
            "for one before the request fails with 500; a follower needs a second connection for a "
            "moment while it opens (the last seq, the stored page)."
        ],
    )


# -- main ------------------------------------------------------------------------------------


async def run(quick: bool, *, runtime_workers: int) -> None:
    rounds, block, per_condition = (2, 4, 4) if quick else (30, 5, 5)
    parts_iterations = 30 if quick else 300
    delta_turns, chunks, delay_ms = (1, 50, 20) if quick else (6, 50, 20)
    sizes, reps, warmup, duration = ([8], 1, 1.0, 2.0) if quick else ([8, 24], 2, 1.0, 6.0)
    holding_steps = [1, 10] if quick else [1, 10, 20, 29, 30]
    load_before = os.getloadavg()
    name = f"sabre_bench_{secrets.token_hex(4)}"
    dsn = f"{ADMIN_DSN.rsplit('/', 1)[0]}/{name}"
    admin = await asyncpg.connect(ADMIN_DSN, timeout=5)
    servers: list[Server] = []
    llm = ScriptedLLM(responder=Responder())
    times = SendTimes()
    tmp = tempfile.TemporaryDirectory(prefix="sabre_events_bench_")
    ctx: Ctx | None = None
    began = time.perf_counter()
    failed = True
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        await upgrade("postgresql+asyncpg://" + dsn.split("://", 1)[1])
        times.install()
        llm.start()
        tmpdir = Path(tmp.name)
        env = sabre_env(
            dsn=dsn,
            llm=llm,
            data_dir=tmpdir / "data",
            SABRE_RUNTIME_WORKERS=str(runtime_workers),
            HOME=str(tmpdir),
        )
        ports = {k: free_port() for k in ("A", "B", "floor")}
        events_state = tmpdir / "a-events"
        for label, module, extra in (
            ("A", "bench.sabre_events_off", {"SABRE_BENCH_EVENTS_TOGGLE": str(events_state)}),
            ("B", "app.cli", {}),
        ):
            argv = [sys.executable, "-m", module, "serve", "--port", str(ports[label])]
            servers.append(launch(label, argv, {**env, **extra}, ports[label], tmpdir))
        floor_argv = [sys.executable, "-m", "uvicorn", "bench.floor_app:app", "--port", str(ports["floor"])]
        servers.append(
            launch(
                "floor",
                [*floor_argv, "--log-level", "warning"],
                clean_env(FLOOR_DATABASE_URL=dsn),
                ports["floor"],
                tmpdir,
            )
        )
        started = time.perf_counter()
        await asyncio.gather(*(wait_ready(s, within=120) for s in servers))
        ready_seconds = time.perf_counter() - started
        by_name = {s.name: s for s in servers}
        ctx = Ctx(
            a=by_name["A"].url,
            b=by_name["B"].url,
            floor=by_name["floor"].url,
            pids={s.name: s.process.pid for s in servers},
            dsn=dsn,
            events_state=events_state,
        )
        print(f"# SABRE events benchmark{' (--quick)' if quick else ''}\n")
        table(
            "1. Setup",
            ["", ""],
            [
                [
                    "machine",
                    f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
                    f"load average at start {load_before[0]:.2f} / {load_before[1]:.2f} / "
                    f"{load_before[2]:.2f} (1 / 5 / 15 min)",
                ],
                ["database", f"`{name}` (fresh, migrated, dropped at the end) + Redis `{REDIS_URL}`"],
                [
                    "A, B",
                    f"`sabre serve` x 2, PostgreSQL + Redis, {runtime_workers} sandbox workers each, "
                    f"chat API, events flushed every {FLUSH_SECONDS * 1000:.0f} ms (default); A runs as "
                    "`python -m bench.sabre_events_off serve` (events on, as `python -m app.cli serve`, "
                    "except while section 2 switches them off), B as `python -m app.cli serve`",
                ],
                ["floor", "`uvicorn bench.floor_app:app`: FastAPI + 1 PG transaction (SQLAlchemy/asyncpg)"],
                ["model", "ScriptedLLM in the bench process: instant replies, or paced ones in section 3"],
                ["all ready after", f"{ready_seconds:.2f} s"],
            ],
        )
        took: list[str] = [f"setup {time.perf_counter() - began:.0f}"]
        for label, section in (
            ("2", per_request_cost(ctx, rounds=rounds, block=block, per_condition=per_condition)),
            ("2d", recorder_parts(ctx, iterations=parts_iterations)),
            ("3", delta_latency(ctx, times, turns=delta_turns, chunks=chunks, delay_ms=delay_ms)),
            ("4", events_per_second(ctx, sizes=sizes, reps=reps, warmup=warmup, duration=duration)),
            ("5", follower_holdings(ctx, steps=holding_steps)),  # last: it may exhaust B's pool a while
        ):
            started = time.perf_counter()
            await section
            took.append(f"{label} {time.perf_counter() - started:.0f}")
        load_after = os.getloadavg()
        print(
            f"\nScripted LLM: {len(llm.requests)} requests. Load average at the end: "
            f"{load_after[0]:.2f} / {load_after[1]:.2f} / {load_after[2]:.2f}. "
            f"Run took {time.perf_counter() - began:.0f} s (by section, s: {', '.join(took)})."
        )
        if ctx.errors:
            print(f"\n**{len(ctx.errors)} unexpected response(s)** (first ones):")
            for error in ctx.errors[:5]:
                print(f"- {error}")
        failed = False
    finally:
        for server in servers:
            server.stop()
        if failed or (ctx is not None and ctx.errors):
            for server in servers:
                tail = server.log_tail(40)
                if tail:
                    print(f"\n{server.name} log tail:\n{tail}")
        llm.stop()
        times.uninstall()
        with contextlib.suppress(Exception):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        tmp.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples, shorter load (under a minute)")
    parser.add_argument("--runtime-workers", type=int, default=2, help="SABRE_RUNTIME_WORKERS of A and B")
    args = parser.parse_args()
    asyncio.run(run(args.quick, runtime_workers=args.runtime_workers))


if __name__ == "__main__":
    main()
