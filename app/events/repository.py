"""SQL for events: append a batch, read a page after a seq, the next seq of a conversation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.kit.given_rows import given_rows, row_arrays
from app.models import Event


class EventRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def append(self, rows: Sequence[dict[str, Any]]) -> None:
        """Insert events (dicts of the ``events`` columns) in one statement (through Core: the
        ORM's bulk path splits a batch into one statement per set of None columns). On PostgreSQL
        one INSERT of the rows given as an array per column: an executemany is one INSERT per
        row on the server (a turn's final transaction wrote 7 to 8 of them)."""
        if not rows:
            return
        if self.session.get_bind().dialect.name == "postgresql":
            await self.session.execute(INSERT_GIVEN_EVENTS, event_arrays(rows))
        else:
            await self.session.execute(_INSERT, list(rows))

    async def last_seq(self, *, conversation_id: str) -> int:
        """The highest stored seq of the conversation, 0 when it has none."""
        result = await self.session.execute(
            select(func.coalesce(func.max(Event.seq), 0)).where(Event.conversation_id == conversation_id)
        )
        return int(result.scalar_one())

    async def page(self, *, conversation_id: str, after: int, limit: int) -> list[Event]:
        """Up to ``limit`` events with seq greater than ``after``, in order."""
        result = await self.session.execute(
            select(Event)
            .where(Event.conversation_id == conversation_id, Event.seq > after)
            .order_by(Event.seq)
            .limit(limit)
        )
        return list(result.scalars())

    async def first_seq_of_turn(self, *, conversation_id: str, turn_id: str) -> int | None:
        """The seq of the turn's first event (its ``turn.started``), None if it has none stored."""
        result = await self.session.execute(
            select(func.min(Event.seq)).where(
                Event.conversation_id == conversation_id, Event.turn_id == turn_id
            )
        )
        value = result.scalar_one_or_none()
        return None if value is None else int(value)


# Built once, on the table (the ORM's bulk path would split a batch by its None columns).
EVENTS_TABLE = cast(Table, Event.__table__)
EVENT_COLUMNS = [column.name for column in EVENTS_TABLE.columns]
_INSERT = insert(EVENTS_TABLE)
# The rows of ``event_arrays``, and their INSERT (a statement of its own, or a CTE of one).
SELECT_GIVEN_EVENTS = given_rows(EVENTS_TABLE, prefix="events", json_column="data")
INSERT_GIVEN_EVENTS = insert(EVENTS_TABLE).from_select(EVENT_COLUMNS, SELECT_GIVEN_EVENTS)


def event_arrays(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Events as one list per column (``events_<column>``) for ``INSERT_GIVEN_EVENTS``, alone or
    as a CTE of a statement that stores more (``data`` as its JSON text)."""
    return row_arrays(rows, EVENTS_TABLE, prefix="events", json_column="data")
