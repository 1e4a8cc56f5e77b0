"""The Redis event bus closes even when its reader loses its cancellation in a Redis call (redis-py
can drop one on Python 3.11: app.kit.periodic)."""

from __future__ import annotations

import asyncio
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
