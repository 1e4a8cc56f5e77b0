"""Per-tenant limits over HTTP, on both stores (in-process counters on SQLite alone, Redis with
PostgreSQL): a tenant over its rate, its concurrent turns or its token quota gets a 429
problem with Retry-After and RateLimit fields, nothing of its request is done, and other tenants
are not affected; a turn's place is given back when it ends, fails or is refused."""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import httpx
import pytest
from sqlalchemy import func, select

from app.kit.db import create_engine
from app.llm.scripted import RecordedRequest, Reply, ScriptedLLM
from app.models import Conversation
from app.wiring import StartupError
from tests.conftest import AppFactory


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def tenants() -> tuple[str, str]:
    """Two fresh tenant names: Redis outlives a test, so counters must not be shared between tests."""
    tag = secrets.token_hex(4)
    return f"acme-{tag}", f"globex-{tag}"


async def conversations_of(store: dict[str, str | None], tenant: str) -> int:
    engine = create_engine(str(store["database_url"]))
    try:
        async with engine.connect() as connection:
            result = await connection.execute(
                select(func.count()).select_from(Conversation).where(Conversation.tenant == tenant)
            )
            return int(result.scalar_one())
    finally:
        await engine.dispose()


def assert_limited(response: httpx.Response, code: str) -> None:
    assert response.status_code == 429, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == code
    assert int(response.headers["retry-after"]) >= 1


async def test_a_burst_over_the_rate_limit_is_refused_for_that_tenant_only(
    make_client: AppFactory, store: dict[str, str | None], llm: ScriptedLLM
) -> None:
    acme, globex = tenants()
    keys = f"{acme}:key-a,{globex}:key-g"
    async with make_client(api_keys=keys, rate_limit="4/minute") as client:
        burst = await asyncio.gather(
            *(client.get("/v1/conversations", headers=bearer("key-a")) for _ in range(7))
        )
        assert sorted(r.status_code for r in burst) == [200] * 4 + [429] * 3
        refused = next(r for r in burst if r.status_code == 429)
        assert_limited(refused, "rate_limited")
        assert refused.headers["ratelimit-policy"] == '"requests";q=4;w=60'
        assert refused.headers["ratelimit"].startswith('"requests";r=0;t=')
        # A refused write does nothing: no conversation, no model call, the key free to reuse.
        write = await client.post(
            "/v1/conversations",
            json={"input": "hi"},
            headers={**bearer("key-a"), "Idempotency-Key": "k1"},
        )
        assert_limited(write, "rate_limited")
        assert await conversations_of(store, acme) == 0
        assert llm.requests == []
        # The other tenant has a window of its own.
        llm.script("hello globex")
        other = await client.post("/v1/conversations", json={"input": "hi"}, headers=bearer("key-g"))
        assert other.status_code == 201, other.text
        # Unauthenticated probes are not counted against anyone.
        assert (await client.get("/healthz")).status_code == 200


async def test_concurrent_turns_are_limited_and_given_back(
    make_client: AppFactory, store: dict[str, str | None]
) -> None:
    acme, globex = tenants()

    def respond(request: RecordedRequest) -> Reply:
        # The newest user text (a failed turn's message stays in the history, merged with the next).
        text = request.last_user_text.strip().splitlines()[-1]
        if text == "slow":
            return Reply(text="slow done", delay=3.0)
        if text == "fail":
            return Reply(status=400, text="scripted failure")
        return Reply(text="ok")

    limits = json.dumps({acme: {"max_concurrent_turns": 1}})
    with ScriptedLLM(responder=respond) as llm:
        async with make_client(
            api_keys=f"{acme}:key-a,{globex}:key-g", tenant_limits=limits, openai_base_url=llm.base_url
        ) as client:
            a, g = bearer("key-a"), bearer("key-g")
            queued = await client.post(
                "/v1/conversations", json={"input": "slow", "background": True}, headers=a
            )
            assert queued.status_code == 202, queued.text
            # While it is queued or running, acme's next turn is refused before anything is written.
            refused = await client.post(
                "/v1/conversations", json={"input": "again"}, headers={**a, "Idempotency-Key": "again-1"}
            )
            assert_limited(refused, "concurrent_turns_limited")
            assert await conversations_of(store, acme) == 1
            # A turn on the existing conversation is refused too, and leaves it as it was.
            conversation = queued.json()["conversation_id"]
            assert_limited(
                await client.post(
                    f"/v1/conversations/{conversation}/messages", json={"input": "x"}, headers=a
                ),
                "concurrent_turns_limited",
            )
            # globex has no such limit.
            others = await asyncio.gather(
                *(client.post("/v1/conversations", json={"input": "hi"}, headers=g) for _ in range(2))
            )
            assert [r.status_code for r in others] == [201, 201]
            # The place comes back when the turn ends.
            deadline = time.monotonic() + 60
            while (await client.get(queued.headers["location"], headers=a)).json()["status"] in (
                "queued",
                "running",
            ):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            # The refused request's Idempotency-Key was not kept: the same key now runs the turn.
            retried = await client.post(
                "/v1/conversations", json={"input": "again"}, headers={**a, "Idempotency-Key": "again-1"}
            )
            assert retried.status_code == 201, retried.text
            # A failed turn gives its place back too (waited for, then in the background).
            failed = await client.post(
                f"/v1/conversations/{conversation}/messages", json={"input": "fail"}, headers=a
            )
            assert failed.status_code == 200, failed.text
            assert failed.json()["status"] == "failed"
            background = await client.post(
                f"/v1/conversations/{conversation}/messages",
                json={"input": "fail", "background": True},
                headers=a,
            )
            assert background.status_code == 202, background.text
            deadline = time.monotonic() + 60
            while (await client.get(background.headers["location"], headers=a)).json()["status"] in (
                "queued",
                "running",
            ):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            after = await client.post(
                f"/v1/conversations/{conversation}/messages", json={"input": "hi"}, headers=a
            )
            assert after.status_code == 200, after.text
            assert after.json()["status"] == "completed", after.json()
            # A turn refused for another reason (a turn already running) gives its place back.
            busy = await client.post(
                f"/v1/conversations/{conversation}/messages",
                json={"input": "slow", "background": True},
                headers=a,
            )
            assert busy.status_code == 202
            assert_limited(
                await client.post(
                    f"/v1/conversations/{conversation}/messages", json={"input": "x"}, headers=a
                ),
                "concurrent_turns_limited",
            )
            cancelled = await client.post(
                f"/v1/conversations/{conversation}/turns/{busy.json()['turn_id']}/cancel", headers=a
            )
            assert cancelled.status_code == 200, cancelled.text
            deadline = time.monotonic() + 60
            while (await client.get(busy.headers["location"], headers=a)).json()["status"] in (
                "queued",
                "running",
            ):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            final = await client.post("/v1/conversations", json={"input": "hi"}, headers=a)
            assert final.status_code == 201, final.text


async def test_token_quota_refuses_turns_once_spent(
    make_client: AppFactory, store: dict[str, str | None], llm: ScriptedLLM
) -> None:
    acme, globex = tenants()
    async with make_client(api_keys=f"{acme}:key-a,{globex}:key-g", token_quota="100/day") as client:
        llm.script(Reply(text="first", input_tokens=80, output_tokens=30))
        first = await client.post("/v1/conversations", json={"input": "hi"}, headers=bearer("key-a"))
        assert first.status_code == 201, first.text
        assert first.json()["usage"]["input_tokens"] == 80
        # 110 tokens recorded: the next turn is refused before it starts; reads still work.
        conversation = first.json()["conversation_id"]
        refused = await client.post(
            f"/v1/conversations/{conversation}/messages", json={"input": "more"}, headers=bearer("key-a")
        )
        assert_limited(refused, "token_quota_exceeded")
        assert refused.headers["ratelimit-policy"] == '"tokens";q=100;w=86400'
        state = await client.get(f"/v1/conversations/{conversation}", headers=bearer("key-a"))
        assert state.status_code == 200
        assert state.json()["version"] == 1  # the refused turn changed nothing
        assert len(llm.requests) == 1
        llm.script("hello globex")
        other = await client.post("/v1/conversations", json={"input": "hi"}, headers=bearer("key-g"))
        assert other.status_code == 201


@pytest.mark.parametrize(
    "settings",
    [
        {"rate_limit": "lots"},
        {"token_quota": "100 per fortnight"},
        {"tenant_limits": "{not json"},
        {"tenant_limits": '{"acme": {"max_concurrent_turns": -1}}'},
        {"tenant_limits": '{"acme": {"rate": "1/second"}}'},
        {"tenant_limits": '["acme"]'},
    ],
)
async def test_malformed_limits_stop_the_start(make_client: AppFactory, settings: dict[str, str]) -> None:
    with pytest.raises(StartupError):
        async with make_client(**settings):
            pass


async def test_a_place_lapses_with_its_lease_unless_renewed(store: dict[str, str | None]) -> None:
    """A runner that died frees its tenant's place once the lease lapses; a live one renews it
    (in memory on the SQLite variant, in Redis on the other)."""
    from app.auth.limits import ConcurrentTurnsLimited, TenantLimiter
    from app.config import Settings
    from app.kit.redis import create_redis

    redis_url = store["redis_url"]
    redis = create_redis(redis_url) if redis_url else None
    settings = Settings(max_concurrent_turns=1, lock_lease_seconds=0.5, redis_url=redis_url)
    limiter = TenantLimiter(settings, redis=redis)
    tenant = f"lease-{secrets.token_hex(4)}"
    try:
        assert await limiter.acquire_turn(tenant, "turn_a")
        with pytest.raises(ConcurrentTurnsLimited):
            await limiter.acquire_turn(tenant, "turn_b")
        for _ in range(3):  # renewed: still held after more than its lease
            await asyncio.sleep(0.3)
            await limiter.renew_turn(tenant, "turn_a")
        with pytest.raises(ConcurrentTurnsLimited):
            await limiter.acquire_turn(tenant, "turn_b")
        await asyncio.sleep(0.7)  # not renewed: lapsed
        assert await limiter.acquire_turn(tenant, "turn_b")
        await limiter.release_turn(tenant, "turn_b")
        assert await limiter.acquire_turn(tenant, "turn_c")
    finally:
        if redis is not None:
            await redis.aclose()
