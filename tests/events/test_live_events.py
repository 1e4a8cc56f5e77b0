"""Live events over real HTTP between two ``sabre serve`` processes on PostgreSQL + Redis: a turn
started on A is watched on B as it happens, and a watcher that disconnects resumes by seq.

The module's tests share the two servers (none of them needs fresh ones or stops one), their
scripted model and their database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from app.llm.scripted import Reply, ScriptedLLM
from tests.conversations.test_stateless import server_env, server_pair
from tests.events.test_turn_events import parse_sse


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    """The scripted model of the module's servers; each test scripts the replies it needs."""
    with ScriptedLLM() as server:
        yield server


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of the servers' home, data and logs (server-a.log, server-b.log)."""
    return tmp_path_factory.mktemp("live-events")


@pytest.fixture(scope="module")
async def two_servers(
    module_postgres_url: str, redis_url: str, llm: ScriptedLLM, logs: Path
) -> AsyncIterator[tuple[str, str]]:
    env = server_env(database_url=module_postgres_url, redis_url=redis_url, llm=llm, home=logs)
    async with server_pair(env, logs) as pair:
        yield pair


async def test_a_turn_on_a_is_watched_live_on_b_and_resumed_after_a_disconnect(
    two_servers: tuple[str, str],
    llm: ScriptedLLM,
    redis_url: str,
    logs: Path,
) -> None:
    a, b = two_servers
    llm.script(Reply(text="word " * 60, chunk_delay=0.03))
    async with httpx.AsyncClient(timeout=30) as http:
        turn = (await http.post(f"{a}/v1/conversations", json={"input": "hi", "background": True})).json()
        url = f"{b}/v1/conversations/{turn['conversation_id']}/events"
        sse = {"Accept": "text/event-stream"}
        seen: list[dict[str, Any]] = []
        arrivals: list[float] = []
        async with http.stream("GET", url, headers=sse) as response:
            assert response.status_code == 200
            buffer = ""
            left = False  # the watcher went away itself (else its stream ended)
            async for chunk in response.aiter_text():
                buffer += chunk
                seen = parse_sse(buffer)
                arrivals.append(time.monotonic())
                if sum(e["event"] == "llm.delta" for e in seen) >= 2:
                    left = True
                    break  # the watcher goes away mid-turn
        assert seen[-1]["event"] != "turn.completed", "the turn ended before it could be watched live"
        last_id = seen[-1]["id"]
        async with http.stream("GET", url, headers={**sse, "Last-Event-ID": last_id}) as response:
            assert response.status_code == 200
            body = (await response.aread()).decode()
            rest = parse_sse(body)
        if not rest:  # a known rare failure: say what the service saw (the cause is not found yet)
            stored_ids = [e["seq"] for e in (await http.get(url, params={"limit": 500})).json()["data"]]
            conv = turn["conversation_id"]
            state = (await http.get(f"{b}/v1/conversations/{conv}/turns/{turn['turn_id']}")).json()
            client = aioredis.Redis.from_url(redis_url)
            try:
                key = f"sabre:lock:conversation:{conv}"
                lock = (await client.get(key), await client.pttl(key))
            finally:
                await client.aclose()
            log_lines = [
                line
                for name in ("server-a.log", "server-b.log")
                for line in (logs / name).read_text(errors="replace").splitlines()
                if conv in line or turn["turn_id"] in line or "error" in line.lower()
            ]
            raise AssertionError(
                f"the reconnected watcher got nothing after {last_id}: {body!r}; stored: {stored_ids}; "
                # An empty reconnect needs a turn no longer running: did the first watcher's own stream
                # end (a turn that failed, or a follower that saw no running turn) before its 2 deltas?
                f"the first watcher {'left' if left else 'saw its stream end'} after "
                f"{[(e['id'], e['event']) for e in seen]}; "
                f"turn now: {state.get('status')} {state.get('error')}; lock (holder, pttl ms): {lock}; "
                # Seen in CI: the turn ran 20 s after its POST and found the one reply taken already.
                f"the model was asked {len(llm.requests)}x: {[r.last_user_text[:20] for r in llm.requests]}; "
                "logs:\n" + "\n".join(log_lines)
            )
        assert rest[0]["id"] == str(int(last_id) + 1)
        assert rest[-1]["event"] == "turn.completed"
        stored = (await http.get(url, params={"limit": 500})).json()["data"]
        assert [e["seq"] for e in stored] == [int(e["id"]) for e in seen + rest]
        text = "".join(e["data"]["data"]["text"] for e in seen + rest if e["event"] == "llm.delta")
        assert text == "word " * 60
        json.dumps(stored)  # plain JSON all the way


async def test_open_followers_hold_no_database_connection(
    two_servers: tuple[str, str],
    module_postgres_url: str,
    llm: ScriptedLLM,
) -> None:
    """An SSE follower holds nothing of the store while it waits (the request's transaction ended
    before the stream began): followers beyond the pool's size still open, the replica still answers."""
    a, b = two_servers
    llm.script("hello")
    async with httpx.AsyncClient(timeout=30) as http:
        conv = (await http.post(f"{a}/v1/conversations", json={"input": "hi"})).json()["conversation_id"]
        url = f"{b}/v1/conversations/{conv}/events?follow=true"
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(35):  # more than the pool's 20 + 10 connections
                response = await stack.enter_async_context(
                    http.stream("GET", url, headers={"Accept": "text/event-stream"})
                )
                assert response.status_code == 200
            started = time.monotonic()
            state = await http.get(f"{b}/v1/conversations/{conv}")
            assert state.status_code == 200, state.text
            assert time.monotonic() - started < 2
            dsn = module_postgres_url.replace("postgresql+asyncpg://", "postgresql://")
            admin = await asyncpg.connect(dsn)
            try:
                # A follower whose headers were sent may still be reading the stored events (a
                # moment in a transaction, under load): what matters is that none stays in one.
                deadline = time.monotonic() + 5
                while True:
                    idle = await admin.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
                    )
                    if idle == 0 or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
            finally:
                await admin.close()
            assert idle == 0
