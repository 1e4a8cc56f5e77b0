"""Fan-out of small messages to the subscribers of a channel, in this process or across replicas.

Events are published after they are committed, so the store is always the truth and a message is
only a fast path: a subscriber that sees a gap, or that falls behind, reads the store instead.
``LocalBus`` reaches subscribers of this process only; ``RedisBus`` reaches every replica through
Redis pub/sub over one connection per process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Final, Protocol

import structlog
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from app.kit import periodic

log = structlog.get_logger(__name__)

# Messages a subscriber may have waiting; past this it is cut off (it resumes from the store).
SUBSCRIBER_BUFFER: Final = 1024
CANCEL_CHANNEL: Final = "sabre:turns:cancel"


def events_channel(conversation_id: str) -> str:
    return f"sabre:events:{conversation_id}"


@dataclass(eq=False)
class Subscription:
    """Messages for one subscriber; ``overflowed`` once it fell ``SUBSCRIBER_BUFFER`` behind."""

    channel: str
    queue: asyncio.Queue[str] = field(default_factory=lambda: asyncio.Queue(SUBSCRIBER_BUFFER))
    overflowed: bool = False

    def offer(self, message: str) -> None:
        if self.overflowed:
            return
        try:
            self.queue.put_nowait(message)
        except asyncio.QueueFull:
            self.overflowed = True


class EventBus(Protocol):
    """Publish to a channel; subscribe to one for as long as a context lasts."""

    # Whether subscribers hear publications of other processes (else they poll the store).
    crosses_processes: bool

    async def publish(self, channel: str, message: str) -> None: ...

    def subscribe(self, channel: str) -> contextlib.AbstractAsyncContextManager[Subscription]: ...

    async def aclose(self) -> None: ...


class LocalBus:
    """Subscribers of this process only (the embedded default, or PostgreSQL without Redis)."""

    crosses_processes = False

    def __init__(self) -> None:
        self._subscribers: dict[str, set[Subscription]] = {}

    async def publish(self, channel: str, message: str) -> None:
        self.dispatch(channel, message)

    def dispatch(self, channel: str, message: str) -> None:
        for subscription in list(self._subscribers.get(channel, ())):
            subscription.offer(message)

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        subscription = Subscription(channel)
        self._subscribers.setdefault(channel, set()).add(subscription)
        try:
            yield subscription
        finally:
            self._forget(subscription)

    def _forget(self, subscription: Subscription) -> bool:
        """Drop a subscriber; True when it was the channel's last."""
        subscribers = self._subscribers.get(subscription.channel)
        if subscribers is None:
            return False
        subscribers.discard(subscription)
        if subscribers:
            return False
        del self._subscribers[subscription.channel]
        return True

    def subscribers(self, channel: str) -> int:
        return len(self._subscribers.get(channel, ()))

    async def aclose(self) -> None:
        self._subscribers.clear()


class RedisBus:
    """Redis pub/sub: one connection per process subscribes to the channels its subscribers want,
    and one reader task hands each message to them."""

    crosses_processes = True

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._local = LocalBus()
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closing = False  # the reader's stop: its cancellation can be lost in a Redis call
        self._leaving: set[asyncio.Task[None]] = set()  # unsubscribes that outlive their watcher

    async def publish(self, channel: str, message: str) -> None:
        await self._redis.publish(channel, message)

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[Subscription]:
        try:
            async with self._local.subscribe(channel) as subscription:
                async with self._lock:
                    pubsub = self._ensure_reader()
                    await pubsub.subscribe(channel)
                yield subscription
        finally:
            # A task of its own, shielded: a watcher cancelled while it waited for the lock here
            # (its stream's client went away) left its channel subscribed for good, and Redis kept
            # sending this process that conversation's events for nobody.
            leaving = asyncio.ensure_future(self._leave(channel))
            self._leaving.add(leaving)
            leaving.add_done_callback(self._leaving.discard)
            await asyncio.shield(leaving)

    async def _leave(self, channel: str) -> None:
        """Unsubscribe ``channel`` once no subscriber of this process is left on it (one that came
        meanwhile subscribed under the same lock, so it keeps the channel)."""
        async with self._lock:
            if self._local.subscribers(channel) == 0 and self._pubsub is not None and not self._closing:
                with contextlib.suppress(Exception):
                    await self._pubsub.unsubscribe(channel)

    def _ensure_reader(self) -> PubSub:
        if self._pubsub is None:
            self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read(self._pubsub), name="sabre-event-bus")
        return self._pubsub

    async def _read(self, pubsub: PubSub) -> None:
        while not self._closing:
            try:
                if not pubsub.subscribed:
                    await asyncio.sleep(0.05)
                    continue
                message = await pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("event_bus_read_failed")
                await asyncio.sleep(0.5)
                continue
            if message is None or message.get("type") != "message":
                continue
            channel, data = message["channel"], message["data"]
            self._local.dispatch(
                channel.decode() if isinstance(channel, bytes) else channel,
                data.decode() if isinstance(data, bytes) else data,
            )

    async def aclose(self) -> None:
        self._closing = True
        if self._reader is not None and not await periodic.stop(self._reader):
            log.warning("event_bus_reader_not_stopped", waited_seconds=periodic.STOP_WAIT)
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        await self._local.aclose()
