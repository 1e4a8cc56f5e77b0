"""Records one turn's events: numbers them, writes them in batches, publishes them once committed.

The turn loop calls ``emit`` and ``delta`` (synchronous, cheap: they only append). Events are
written in their own short transaction at most every ``flush_interval`` while the turn runs, so a
watcher sees them within about that time, and what is left is written in the turn's final
transaction (``drain``): a fast turn costs no extra transaction at all. Text deltas are coalesced
into the last unwritten ``llm.delta`` of the same call, so a long answer writes one row per flush
window, not one per token. Only what is committed is published, so a live watcher and a later
reader of the store see exactly the same events with the same seqs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.events.bus import EventBus, events_channel
from app.events.repository import EventRepository
from app.events.schemas import EventType
from app.kit.clock import utcnow
from app.kit.ids import new_id

log = structlog.get_logger(__name__)

DRAIN_WAIT_SECONDS = 5.0


class TurnRecorder:
    """The events of one turn of one conversation, from ``next_seq`` on."""

    def __init__(
        self,
        *,
        conversation_id: str,
        turn_id: str,
        next_seq: int,
        bus: EventBus | None,
        sessionmaker: async_sessionmaker[AsyncSession] | None,
        flush_interval: float = 0.05,
    ) -> None:
        """``sessionmaker`` None: nothing is written before ``drain`` (a conversation not yet stored)."""
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        self._seq = next_seq
        self._bus = bus
        self._sessionmaker = sessionmaker
        self._interval = flush_interval
        self._pending: list[dict[str, Any]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._writing = False  # the flusher is inside its transaction: wait for it, never cancel it
        self._failed = False  # the last background write failed
        self.root: str | None = None  # the id of this turn's ``turn.started``

    # -- recording (synchronous: called from the loop's hot path) --------------------------------

    def emit(self, type_: EventType, data: dict[str, Any], *, parent: str | None = None) -> str:
        """Record an event; returns its id (the parent of the events nested under it)."""
        event_id = new_id("evt")
        self._pending.append(
            {
                "id": event_id,
                "conversation_id": self.conversation_id,
                "seq": self._seq,
                "turn_id": self.turn_id,
                "parent_id": parent if parent is not None else self.root,
                "type": type_,
                "data": data,
                "created_at": utcnow(),
            }
        )
        self._seq += 1
        if type_ == "turn.started" and self.root is None:
            self.root = event_id
        self._schedule()
        return event_id

    def delta(self, text: str, *, parent: str) -> None:
        """Model text as it streams, appended to the last unwritten delta of the same call."""
        if not text:
            return
        last = self._pending[-1] if self._pending else None
        if last is not None and last["type"] == "llm.delta" and last["parent_id"] == parent:
            last["data"] = {"text": last["data"]["text"] + text}
            return
        self.emit("llm.delta", {"text": text}, parent=parent)

    @property
    def next_seq(self) -> int:
        return self._seq

    # -- writing -------------------------------------------------------------------------------

    def _schedule(self) -> None:
        if self._sessionmaker is None or self._flusher is not None:
            return
        self._failed = False
        self._flusher = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        try:
            await asyncio.sleep(self._interval)
            self._writing = True
            await self._write_pending()
        finally:
            self._writing = False
            self._flusher = None
            # After a failed write the events wait for the next emit or for ``drain``: a store that
            # refuses them (down, or a constraint) is not hammered every interval.
            if self._pending and self._sessionmaker is not None and not self._failed:
                self._schedule()

    async def _write_pending(self) -> None:
        batch, self._pending = self._pending, []
        if not batch or self._sessionmaker is None:
            return
        try:
            async with self._sessionmaker() as session, session.begin():
                await EventRepository(session).append(batch)
        except asyncio.CancelledError:
            self._pending[:0] = batch  # written or not, unknown: the final transaction settles it
            raise
        except Exception:
            # Not lost: they go into the turn's final transaction with the rest.
            log.warning("events_flush_failed", conversation_id=self.conversation_id, exc_info=True)
            self._pending[:0] = batch
            self._failed = True
            return
        self._failed = False
        await self.publish(batch)

    async def _stop_flusher(self) -> None:
        """No more background writes: a sleeping flusher is cancelled, a writing one awaited for
        up to ``DRAIN_WAIT_SECONDS`` (a connection the store broke can hang), then cancelled; the
        batch of a cancelled write goes back to the pending events."""
        flusher, self._sessionmaker = self._flusher, None
        if flusher is None:
            return
        if not self._writing:
            flusher.cancel()
        done, _ = await asyncio.wait({flusher}, timeout=DRAIN_WAIT_SECONDS)
        if not done:
            log.warning("events_flush_stuck", conversation_id=self.conversation_id)
            flusher.cancel()
            await asyncio.wait({flusher}, timeout=1.0)

    async def stop_writing(self) -> None:
        """Let a background write finish, and start no other: called before the turn's final
        transaction writes anything. On SQLite that transaction holds the only write lock, so a
        background write still waiting for it could only time out, its events lost to the drain."""
        await self._stop_flusher()

    async def take(self) -> list[dict[str, Any]]:
        """Stop writing in the background and hand over what is left, for the caller to store in
        its own statement of the turn's final transaction, commit, then ``publish``."""
        await self._stop_flusher()
        batch, self._pending = self._pending, []
        return batch

    async def drain(self, session: AsyncSession) -> list[dict[str, Any]]:
        """Stop writing in the background and add what is left to ``session``'s transaction; the
        caller commits it and then calls ``publish`` with the returned rows."""
        batch = await self.take()
        await EventRepository(session).append(batch)
        return batch

    async def close(self) -> None:
        """The turn failed before its final transaction: stop writing, drop what is unwritten."""
        await self._stop_flusher()
        self._pending = []

    async def publish(self, rows: Sequence[dict[str, Any]]) -> None:
        """Tell live watchers about committed events (best effort: they fall back to the store)."""
        if self._bus is None or not rows:
            return
        try:
            await self._bus.publish(events_channel(self.conversation_id), encode(rows))
        except Exception:
            log.warning("events_publish_failed", conversation_id=self.conversation_id, exc_info=True)


def encode(rows: Sequence[dict[str, Any]]) -> str:
    """Event rows as the JSON list published on the bus (the API's event shape)."""
    return json.dumps(
        [
            {
                "id": row["id"],
                "seq": row["seq"],
                "turn_id": row["turn_id"],
                "parent_id": row["parent_id"],
                "type": row["type"],
                "created_at": row["created_at"].isoformat(),
                "data": row["data"],
            }
            for row in rows
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    )
