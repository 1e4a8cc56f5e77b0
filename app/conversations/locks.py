"""One turn at a time per conversation: a lease lock in Redis, or in the database without Redis.

A lease, not a plain lock, so that a replica that dies mid-turn cannot block a conversation forever:
the lease expires and the next request proceeds. A running turn renews its lease.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

import structlog
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.conversations.repository import ConversationRepository
from app.kit.clock import utcnow

log = structlog.get_logger(__name__)

# Delete or extend the key only if it still holds our token (the turn id).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ConversationLocks(Protocol):
    """Take, renew and release a conversation's turn lock."""

    async def acquire(self, conversation_id: str, *, turn_id: str) -> str | None:
        """Take the lock for ``turn_id``; on contention return the holder's turn id instead. A
        lock ``turn_id`` holds already (a queued turn's, taken by the request that queued it) is
        taken again with a fresh lease: it may have lapsed before the turn's first renewal."""
        ...

    async def renew(self, conversation_id: str, *, turn_id: str) -> bool:
        """Extend the lease; False when the lock was lost."""
        ...

    async def release(self, conversation_id: str, *, turn_id: str) -> None:
        """Give the lock back (no-op if it already expired or moved on)."""
        ...

    async def holder(self, conversation_id: str) -> str | None:
        """The turn currently holding the lock, if any."""
        ...


class RedisLocks:
    """Locks as ``SET NX PX`` keys holding the turn id."""

    def __init__(self, redis: Redis, *, lease_seconds: float) -> None:
        self._redis = redis
        self._lease_ms = int(lease_seconds * 1000)

    @staticmethod
    def _key(conversation_id: str) -> str:
        return f"sabre:lock:conversation:{conversation_id}"

    async def acquire(self, conversation_id: str, *, turn_id: str) -> str | None:
        key = self._key(conversation_id)
        if await self._redis.set(key, turn_id, nx=True, px=self._lease_ms):
            return None
        if await self.renew(conversation_id, turn_id=turn_id):
            return None  # this turn's own lock
        holder = await self._redis.get(key)
        if holder is None:  # expired between the two calls: try once more
            if await self._redis.set(key, turn_id, nx=True, px=self._lease_ms):
                return None
            holder = await self._redis.get(key)
        return _text(holder) if holder else "unknown"

    async def renew(self, conversation_id: str, *, turn_id: str) -> bool:
        renewed = await self._redis.eval(_RENEW, 1, self._key(conversation_id), turn_id, self._lease_ms)
        return bool(renewed)

    async def release(self, conversation_id: str, *, turn_id: str) -> None:
        await self._redis.eval(_RELEASE, 1, self._key(conversation_id), turn_id)

    async def holder(self, conversation_id: str) -> str | None:
        value = await self._redis.get(self._key(conversation_id))
        return _text(value) if value else None


class DatabaseLocks:
    """Locks as two columns of the conversation row, each change in its own short transaction."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], *, lease_seconds: float) -> None:
        self._sessionmaker = sessionmaker
        self._lease = timedelta(seconds=lease_seconds)

    async def acquire(self, conversation_id: str, *, turn_id: str) -> str | None:
        now = utcnow()
        async with self._sessionmaker() as session, session.begin():
            repo = ConversationRepository(session)
            if await repo.try_lock(
                conversation_id=conversation_id,
                turn_id=turn_id,
                now=now,
                expires_at=now + self._lease,
            ):
                return None
            return await repo.lock_holder(conversation_id=conversation_id, now=now) or "unknown"

    async def renew(self, conversation_id: str, *, turn_id: str) -> bool:
        async with self._sessionmaker() as session, session.begin():
            return await ConversationRepository(session).renew_lock(
                conversation_id=conversation_id, turn_id=turn_id, expires_at=utcnow() + self._lease
            )

    async def release(self, conversation_id: str, *, turn_id: str) -> None:
        async with self._sessionmaker() as session, session.begin():
            await ConversationRepository(session).unlock(conversation_id=conversation_id, turn_id=turn_id)

    async def holder(self, conversation_id: str) -> str | None:
        async with self._sessionmaker() as session:
            return await ConversationRepository(session).lock_holder(
                conversation_id=conversation_id, now=utcnow()
            )
