"""The conversation lock, on Redis and in the database: a turn that takes again the lock it holds
(a queued turn whose request took it) gets a fresh lease, so it cannot lapse before the turn's
first renewal while another request takes the conversation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from app.conversations.locks import ConversationLocks, DatabaseLocks, RedisLocks
from app.kit.db import create_engine, create_sessionmaker
from app.kit.ids import new_id
from tests.conversations.rows import conversation_row

LEASE = 0.6


@pytest.fixture(params=["redis", "sqlite", "postgres"])
def where(request: pytest.FixtureRequest) -> tuple[str, str]:
    """The lock's kind and the URL of what holds it."""
    fixture = {"redis": "redis_url", "sqlite": "sqlite_url", "postgres": "postgres_url"}[request.param]
    return request.param, request.getfixturevalue(fixture)


@pytest.fixture
async def locks(where: tuple[str, str]) -> AsyncIterator[tuple[ConversationLocks, str]]:
    """Each kind of lock, with a conversation to lock."""
    kind, url = where
    if kind == "redis":
        client = aioredis.Redis.from_url(url)
        try:
            yield RedisLocks(client, lease_seconds=LEASE), new_id("conv")
        finally:
            await client.aclose()
        return
    engine = create_engine(url)
    sessionmaker = create_sessionmaker(engine)
    conversation = conversation_row()
    async with sessionmaker() as session, session.begin():
        session.add(conversation)
    try:
        yield DatabaseLocks(sessionmaker, lease_seconds=LEASE), conversation.id
    finally:
        await engine.dispose()


async def test_taking_again_a_lock_one_holds_renews_its_lease(locks: tuple[ConversationLocks, str]) -> None:
    lock, conversation = locks
    assert await lock.acquire(conversation, turn_id="turn_a") is None
    await asyncio.sleep(LEASE * 0.6)
    assert await lock.acquire(conversation, turn_id="turn_a") is None  # its own: taken again
    await asyncio.sleep(LEASE * 0.6)  # past the first lease, within the second
    assert await lock.acquire(conversation, turn_id="turn_b") == "turn_a"
    assert await lock.holder(conversation) == "turn_a"
    await lock.release(conversation, turn_id="turn_a")
    assert await lock.acquire(conversation, turn_id="turn_b") is None
