"""``follow``, the reader behind every event stream, as its consumer goes away."""

from __future__ import annotations

import asyncio
import json

from app.events.bus import LocalBus, events_channel
from app.events.schemas import EventOut
from app.events.stream import CutOff, Heartbeat, follow
from app.kit.clock import utcnow
from app.kit.db import create_engine, create_sessionmaker
from app.kit.ids import new_id
from tests.conversations.test_idempotency_lease import wait_for


async def _true() -> bool:
    return True


async def test_a_stream_cancelled_as_an_event_arrives_ends(sqlite_url: str) -> None:
    """The stream's request goes away (its task is cancelled) in the very step a live event reaches
    its queue. ``asyncio.wait_for`` on Python 3.11 hands back the event and drops the cancellation
    when both land together: the stream then followed the conversation for ever, its client gone."""
    engine = create_engine(sqlite_url)
    bus = LocalBus()
    conversation = new_id("conv")
    channel = events_channel(conversation)
    got: list[EventOut | Heartbeat | CutOff] = []

    async def consume() -> None:
        stream = follow(
            sessionmaker=create_sessionmaker(engine),
            bus=bus,
            conversation_id=conversation,
            after=0,
            mode="forever",
            running=_true,
        )
        async for event in stream:
            got.append(event)

    task = asyncio.create_task(consume())
    try:
        # Subscribed, the store read: waiting for a live event.
        await wait_for(lambda: bus.subscribers(channel) and getattr(_queue(bus, channel), "_getters", None))
        event = {
            "id": new_id("evt"),
            "seq": 1,
            "turn_id": new_id("turn"),
            "parent_id": None,
            "type": "turn.started",
            "created_at": utcnow().isoformat(),
            "data": {},
        }
        bus.dispatch(channel, json.dumps([event]))
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=3)
        assert done, "the stream went on after its task was cancelled"
        assert task.cancelled()
        assert bus.subscribers(channel) == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await engine.dispose()


def _queue(bus: LocalBus, channel: str) -> asyncio.Queue[str]:
    (subscription,) = bus._subscribers[channel]
    return subscription.queue
