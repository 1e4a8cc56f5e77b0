"""Reading a conversation's events: what is stored after a seq, then what happens live.

``follow`` subscribes before it reads the store, so nothing committed in between is missed; live
messages that leave a gap (or a subscriber that fell behind) send it back to the store. Without a
bus that crosses processes, it polls the store, so a turn running in another process is still seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.events.bus import EventBus, events_channel
from app.events.repository import EventRepository
from app.events.schemas import END_TYPES, EventOut

PAGE: Final = 500
POLL_SECONDS: Final = 0.25  # how often the store is read when no bus brings other processes' events
CHECK_SECONDS: Final = 2.0  # how often a follower asks whether a turn is still running
HEARTBEAT_SECONDS: Final = 15.0

FollowMode = Literal["turn", "forever"]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Nothing happened for a while: an SSE comment keeps proxies from closing the stream."""


@dataclass(frozen=True, slots=True)
class CutOff:
    """The reader fell too far behind the live events and is disconnected (it resumes by seq)."""


async def stored_page(
    sessionmaker: async_sessionmaker[AsyncSession], *, conversation_id: str, after: int, limit: int
) -> list[EventOut]:
    async with sessionmaker() as session:
        rows = await EventRepository(session).page(conversation_id=conversation_id, after=after, limit=limit)
    return [
        EventOut(
            id=row.id,
            seq=row.seq,
            turn_id=row.turn_id,
            parent_id=row.parent_id,
            type=row.type,
            created_at=row.created_at,
            data=row.data,
        )
        for row in rows
    ]


async def follow(
    *,
    sessionmaker: async_sessionmaker[AsyncSession],
    bus: EventBus,
    conversation_id: str,
    after: int,
    mode: FollowMode,
    running: Callable[[], Awaitable[bool]],
    heartbeat: float = HEARTBEAT_SECONDS,
) -> AsyncIterator[EventOut | Heartbeat | CutOff]:
    """Events after ``after``: the stored ones, then live ones.

    ``mode="turn"`` ends once nothing runs on the conversation (after the end event of the turn that
    was running, or right after the replay when none was); ``"forever"`` stays, with heartbeats.
    ``running`` says whether a turn is queued or running on the conversation now.
    """
    last = after
    async with bus.subscribe(events_channel(conversation_id)) as subscription:

        async def from_store() -> AsyncIterator[EventOut]:
            nonlocal last
            while True:
                page = await stored_page(
                    sessionmaker, conversation_id=conversation_id, after=last, limit=PAGE
                )
                for event in page:
                    last = event.seq
                    yield event
                if len(page) < PAGE:
                    return

        async for event in from_store():
            yield event
        if mode == "turn" and not await running():
            async for event in from_store():  # what committed between the replay and the check
                yield event
            return

        quiet_since = checked_at = time.monotonic()
        wait = POLL_SECONDS if not bus.crosses_processes else min(heartbeat, CHECK_SECONDS)
        while True:
            if subscription.overflowed:
                yield CutOff()
                return
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancellation (the
            # client went away) that lands as a message arrives, and the stream would go on.
            message: str | None = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    message = await subscription.queue.get()
            ended = False
            if message is not None:
                for item in json.loads(message):
                    if item["seq"] <= last:
                        continue
                    if item["seq"] != last + 1:  # a gap: the store has what the bus skipped
                        async for event in from_store():
                            ended |= event.type in END_TYPES
                            yield event
                        if last >= item["seq"]:
                            continue
                    event = EventOut.model_validate(item)
                    last = event.seq
                    ended |= event.type in END_TYPES
                    yield event
                quiet_since = time.monotonic()
            elif not bus.crosses_processes:
                async for event in from_store():
                    ended |= event.type in END_TYPES
                    yield event
                    quiet_since = time.monotonic()
            now = time.monotonic()
            if mode == "turn" and (ended or now - checked_at >= CHECK_SECONDS):
                checked_at = now
                if not await running():
                    async for event in from_store():
                        yield event
                    return
            if mode == "forever" and now - quiet_since >= heartbeat:
                quiet_since = now
                yield Heartbeat()
