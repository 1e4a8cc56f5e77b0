"""The Redis event bus closes even when its reader loses its cancellation in a Redis call (redis-py
can drop one on Python 3.11: app.kit.periodic)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub

from app.events.bus import RedisBus


async def test_the_bus_closes_though_its_reader_loses_its_cancellation(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = PubSub.get_message
    waiting = asyncio.Event()
    lost = asyncio.Event()

    async def get_message(self: PubSub, **kwargs: Any) -> Any:
        waiting.set()
        try:
            return await real(self, **kwargs)
        except asyncio.CancelledError:
            lost.set()  # returns as if no message had come, as redis-py may
            return None

    monkeypatch.setattr(PubSub, "get_message", get_message)
    redis = aioredis.Redis.from_url(redis_url)
    bus = RedisBus(redis)
    try:
        async with bus.subscribe("sabre:test:bus"):
            # Closed while still subscribed: the reader is then inside the patched call (once
            # unsubscribed it would wait in a plain sleep instead, which takes its cancellation).
            await asyncio.wait_for(waiting.wait(), 10)
            closing = asyncio.create_task(bus.aclose())
            done, _ = await asyncio.wait({closing}, timeout=10)
            if not done:  # before: aclose waited for the reader for ever
                monkeypatch.undo()
                assert bus._reader is not None
                bus._reader.cancel()
            assert done, "the bus never closed"
            assert lost.is_set()
    finally:
        await redis.aclose()


async def test_watchers_cancelled_at_any_step_leave_the_bus_whole(redis_url: str) -> None:
    """Stream clients go away at any moment: watchers cancelled at any step of their subscription
    (waiting for the bus's lock behind others, subscribing, watching, leaving) must not cost the
    other watchers their messages, unsubscribe a channel someone still watches, or leave their
    own channels subscribed. (A subscribe or unsubscribe itself does not yield in redis-py while
    the socket takes the command; a cancellation inside one, when it does, makes redis-py drop
    the connection and subscribe its channels again on the next read.)"""
    redis = aioredis.Redis.from_url(redis_url)
    bus = RedisBus(redis)
    steady_channel = "sabre:test:bus-steady"
    try:
        async with bus.subscribe(steady_channel) as steady:

            async def watcher(channel: str) -> None:
                async with bus.subscribe(channel):
                    await asyncio.sleep(0)

            chance = random.Random(12)
            for batch in range(60):
                # Five at once, so some wait for the lock; every third watches the steady channel
                # too (its last-one-leaves check must not unsubscribe it from the steady watcher).
                tasks = [
                    asyncio.create_task(
                        watcher(steady_channel if index % 3 == 0 else f"sabre:test:bus-{batch}-{index}")
                    )
                    for index in range(5)
                ]
                for task in tasks:
                    for _ in range(chance.randrange(0, 8)):  # a different step each time
                        await asyncio.sleep(0)
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await redis.publish(steady_channel, "still here")
            async with asyncio.timeout(2):
                assert await steady.queue.get() == "still here"
            assert bus._pubsub is not None
            subscribed = {c.decode() if isinstance(c, bytes) else c for c in bus._pubsub.channels}
            assert subscribed == {steady_channel}
    finally:
        await bus.aclose()
        await redis.aclose()
