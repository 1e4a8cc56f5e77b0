"""The Redis event bus closes even when its reader loses its cancellation in a Redis call (redis-py
can drop one on Python 3.11: app.kit.periodic)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from app.events.bus import RedisBus


async def test_the_bus_closes_though_its_reader_loses_its_cancellation(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    bus = RedisBus(redis)
    lost = asyncio.Event()
    try:
        async with bus.subscribe("sabre:test:bus"):
            pubsub: Any = bus._pubsub
            real = pubsub.get_message

            async def get_message(**kwargs: Any) -> Any:
                try:
                    return await real(**kwargs)
                except asyncio.CancelledError:
                    lost.set()  # returns as if no message had come, as redis-py may
                    return None

            monkeypatch.setattr(pubsub, "get_message", get_message)
            await asyncio.sleep(0.1)  # the reader is waiting in the patched call
        closing = asyncio.create_task(bus.aclose())
        done, _ = await asyncio.wait({closing}, timeout=10)
        if not done:  # before: aclose waited for the reader for ever
            assert bus._reader is not None
            monkeypatch.undo()
            bus._reader.cancel()
        assert done, "the bus never closed"
        assert lost.is_set()
    finally:
        await redis.aclose()
