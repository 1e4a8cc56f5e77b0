"""All SQL of the conversations domain."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast

from sqlalchemy import (
    JSON,
    BindParameter,
    ColumnElement,
    Insert,
    Select,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    true,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import defer
from sqlalchemy.orm.attributes import instance_state, set_committed_value

from app.events.repository import (
    EVENT_COLUMNS,
    EVENTS_TABLE,
    INSERT_GIVEN_EVENTS,
    SELECT_GIVEN_EVENTS,
    EventRepository,
    event_arrays,
)
from app.kit.clock import utcnow
from app.kit.given_rows import given_rows, row_arrays
from app.kit.json_body import INT64_MAX, INT64_MIN
from app.models import ChatLink, Conversation, Event, Message, StoredFile, Turn


@dataclass(frozen=True, slots=True)
class TurnState:
    """What a new turn checks under the lock, read in one round trip."""

    version: int
    last_event_seq: int
    active_turn: bool


class ConversationRepository:
    """Queries over conversations, their messages and turns; every read is scoped by tenant."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get(self, *, tenant: str, conversation_id: str) -> Conversation | None:
        """The tenant's conversation, or None (another tenant's id is the same as no id)."""
        result = await self.session.execute(_GET, {"conversation_id": conversation_id, "tenant": tenant})
        return result.scalar_one_or_none()

    def add(self, conversation: Conversation) -> None:
        """Stage a new conversation."""
        self.session.add(conversation)

    async def delete(self, conversation: Conversation) -> None:
        """Delete a conversation and everything it owns (messages and turns cascade)."""
        await self.session.execute(delete(Message).where(Message.conversation_id == conversation.id))
        await self.session.execute(delete(Turn).where(Turn.conversation_id == conversation.id))
        await self.session.execute(delete(Event).where(Event.conversation_id == conversation.id))
        await self.session.execute(delete(StoredFile).where(StoredFile.conversation_id == conversation.id))
        await self.session.execute(delete(ChatLink).where(ChatLink.conversation_id == conversation.id))
        await self.session.delete(conversation)

    async def messages(
        self, *, conversation_id: str, after: int = -1, limit: int | None = None
    ) -> Sequence[Message]:
        """Messages in order, from ``seq > after``, at most ``limit``."""
        query = (
            select(Message)
            .where(Message.conversation_id == conversation_id, Message.seq > after)
            .order_by(Message.seq)
        )
        if limit is not None:
            query = query.limit(limit)
        return (await self.session.execute(query)).scalars().all()

    async def turn_state(self, *, conversation_id: str, now: datetime) -> TurnState | None:
        """The conversation's version, its last event seq and whether a turn is queued or running
        under a live lease (None once deleted): one statement on the hot path of every turn."""
        row = (
            await self.session.execute(_TURN_STATE, {"conversation_id": conversation_id, "now": now})
        ).first()
        if row is None:
            return None
        return TurnState(version=row[0], last_event_seq=int(row[1]), active_turn=bool(row[2]))

    async def start_turn(self, values: Mapping[str, Any], *, seen_version: int, now: datetime) -> int | None:
        """Store a turn (``values``: every ``turns`` column) if its conversation is still at
        ``seen_version`` and no other turn is queued or running under a live lease: the checks and
        the write in one statement. The conversation's last event seq, or None when a check failed
        (``turn_state`` then says which) and nothing was written."""
        params = {f"new_{key}": value for key, value in values.items()}
        params |= {"conversation_id": values["conversation_id"], "seen_version": seen_version, "now": now}
        row = (await self.session.execute(_START_TURN, params)).first()
        return None if row is None else int(row[0])

    async def start_turn_reading_history(
        self, values: Mapping[str, Any], *, seen_version: int, now: datetime
    ) -> tuple[int, list[tuple[Any, Any]]] | None:
        """``start_turn``, then ``history``: on PostgreSQL in one statement (the turn's INSERT as
        a data-modifying CTE the messages are joined to, one round trip fewer for every turn of
        an existing conversation), elsewhere two. None, with nothing written, when a check failed."""
        if not self._postgres:
            last_seq = await self.start_turn(values, seen_version=seen_version, now=now)
            if last_seq is None:
                return None
            return last_seq, await self.history(conversation_id=values["conversation_id"])
        params = {f"new_{key}": value for key, value in values.items()}
        params |= {"conversation_id": values["conversation_id"], "seen_version": seen_version, "now": now}
        rows = (await self.session.execute(_START_TURN_WITH_HISTORY, params)).all()
        if not rows:  # the INSERT wrote nothing: no row to join the messages to
            return None
        # One row per message (seq order), or a single row of NULLs when there is none yet.
        return int(rows[0][0]), [(row[1], row[2]) for row in rows if row[1] is not None]

    async def insert_new(
        self,
        conversation: Conversation,
        turn: Turn,
        messages: Sequence[dict[str, Any]],
        *,
        events: Sequence[dict[str, Any]],
    ) -> None:
        """Store a conversation created by this request, its first turn, its messages and its
        events, all built in memory (never added to the session): on PostgreSQL one statement (the
        inserts as data-modifying CTEs), elsewhere four. Columns left unset take their defaults."""
        conversation_values, turn_values = _column_values(conversation), _column_values(turn)
        if self._postgres:
            params = {f"conversation_{key}": value for key, value in conversation_values.items()}
            params |= {f"turn_{key}": value for key, value in turn_values.items()}
            params |= _message_arrays(messages)
            params |= event_arrays(events)
            await self.session.execute(_insert_new(tuple(conversation_values), tuple(turn_values)), params)
            return
        await self.session.execute(_INSERT_CONVERSATION, conversation_values)
        await self.session.execute(_INSERT_TURN, turn_values)
        await self.insert_messages(messages)
        await EventRepository(self.session).append(events)

    async def finish(
        self,
        conversation: Conversation,
        *,
        seen_version: int,
        values: Mapping[str, Any],
        turn_id: str,
        finished: Mapping[str, Any],
        messages: Sequence[dict[str, Any]],
        events: Sequence[dict[str, Any]] = (),
        cancelled_end: dict[str, Any] | None = None,
    ) -> Turn | Literal["stale", "gone"]:
        """Store a turn's outcome: on its conversation ``values`` (by attribute), on its turn
        ``finished`` (by column), its new ``messages`` and its last ``events`` (its end event
        last), if the conversation is still at ``seen_version``. On PostgreSQL in one statement
        (data-modifying CTEs), elsewhere four.

        The end event says whether the turn was asked to cancel, which only the stored row knows
        (a request may come while the turn runs): ``cancelled_end`` is its data should the row
        carry one, and the row decides which of the two is stored.

        The turn's row as stored (a cancel request that came meanwhile included); ``"stale"``
        when another turn changed the conversation first (its lease had lapsed: the caller rolls
        back); ``"gone"`` when the conversation was written but the turn's row is missing (its
        events are then not stored: the caller stores them with the row it makes again). The
        loaded object then holds ``values`` as stored, not dirty."""
        values = {"updated_at": utcnow(), **values}  # not left to the column's onupdate: in a CTE it is NULL
        conversation_params = {f"conversation_{key}": value for key, value in values.items()}
        conversation_params |= {"finished_conversation_id": conversation.id, "seen_version": seen_version}
        turn_params = {f"turn_{key}": value for key, value in finished.items()}
        turn_params["finished_turn_id"] = turn_id
        if self._postgres:
            statement = _finish_postgres(tuple(values), tuple(finished))
            params = {**conversation_params, **turn_params, **_message_arrays(messages)}
            params |= event_arrays(events)
            # No other data for the end event: it is stored as given, whatever the row says.
            end_id = events[-1]["id"] if events and cancelled_end is not None else None
            params |= {"end_event_id": end_id, "end_event_cancelled": json.dumps(cancelled_end)}
            ended = (await self.session.execute(statement, params)).one_or_none()
            if ended is None:  # no conversation row was written
                return "stale"
            row = None if ended.id is None else ended
        else:
            result = await self.session.execute(_finish_conversation(tuple(values)), conversation_params)
            if not getattr(result, "rowcount", 0):
                return "stale"
            row = (await self.session.execute(_finish_turn(tuple(finished)), turn_params)).one_or_none()
            await self.insert_messages(messages)
            if row is not None and events:
                if row.cancel_requested_at is not None and cancelled_end is not None:
                    events = [*events[:-1], {**events[-1], "data": cancelled_end}]
                await EventRepository(self.session).append(events)
        for key, value in values.items():
            set_committed_value(conversation, key, value)
        return "gone" if row is None else Turn(**row._asdict())

    @property
    def _postgres(self) -> bool:
        return self.session.get_bind().dialect.name == "postgresql"

    async def history(self, *, conversation_id: str) -> list[tuple[Any, Any]]:
        """``(role, parts)`` of every message in order, without building ORM objects (hot path)."""
        result = await self.session.execute(_HISTORY, {"conversation_id": conversation_id})
        return [(row[0], row[1]) for row in result]

    async def insert_messages(self, rows: Sequence[dict[str, Any]]) -> None:
        """Insert many messages in one statement (through Core: the ORM's bulk path splits a
        batch into one statement per set of None columns)."""
        if rows:
            await self.session.execute(_INSERT_MESSAGE, list(rows))

    async def try_lock(
        self, *, conversation_id: str, turn_id: str, now: datetime, expires_at: datetime
    ) -> bool:
        """Take the conversation's database lock if it is free, its lease expired or ``turn_id``
        holds it already (then with a fresh lease)."""
        result = await self.session.execute(
            update(Conversation)
            .where(
                Conversation.id == conversation_id,
                or_(
                    Conversation.lock_turn_id.is_(None),
                    Conversation.lock_expires_at < now,
                    Conversation.lock_turn_id == turn_id,
                ),
            )
            .values(lock_turn_id=turn_id, lock_expires_at=expires_at)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    async def lock_holder(self, *, conversation_id: str, now: datetime) -> str | None:
        """The turn holding a live database lock on the conversation, if any."""
        result = await self.session.execute(
            select(Conversation.lock_turn_id).where(
                Conversation.id == conversation_id, Conversation.lock_expires_at >= now
            )
        )
        return result.scalar_one_or_none()

    async def renew_lock(self, *, conversation_id: str, turn_id: str, expires_at: datetime) -> bool:
        """Extend the lease of a lock this turn holds."""
        result = await self.session.execute(
            update(Conversation)
            .where(Conversation.id == conversation_id, Conversation.lock_turn_id == turn_id)
            .values(lock_expires_at=expires_at)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    async def unlock(self, *, conversation_id: str, turn_id: str) -> None:
        """Release the lock if this turn still holds it."""
        await self.session.execute(
            update(Conversation)
            .where(Conversation.id == conversation_id, Conversation.lock_turn_id == turn_id)
            .values(lock_turn_id=None, lock_expires_at=None)
            .execution_options(synchronize_session=False)
        )

    # -- turns as resources ----------------------------------------------------------------------

    async def turn(self, *, conversation_id: str, turn_id: str) -> Turn | None:
        """A turn of the conversation (the conversation was already checked against the tenant)."""
        result = await self.session.execute(
            select(Turn).where(Turn.id == turn_id, Turn.conversation_id == conversation_id)
        )
        return result.scalar_one_or_none()

    async def turns(self, *, conversation_id: str, before: Turn | None, limit: int) -> list[Turn]:
        """Turns newest first, those created before ``before`` when given."""
        query = select(Turn).where(Turn.conversation_id == conversation_id)
        if before is not None:
            query = query.where(
                or_(
                    Turn.created_at < before.created_at,
                    and_(Turn.created_at == before.created_at, Turn.id < before.id),
                )
            )
        result = await self.session.execute(
            query.order_by(Turn.created_at.desc(), Turn.id.desc()).limit(limit)
        )
        return list(result.scalars())

    async def claim_turn(self, *, turn_id: str, owner: str, now: datetime, until: datetime) -> bool:
        """Take a stored turn to run it: queued, or running under a lease that expired."""
        result = await self.session.execute(
            update(Turn)
            .where(
                Turn.id == turn_id,
                Turn.request.is_not(None),
                or_(Turn.status == "queued", and_(Turn.status == "running", Turn.lease_expires_at < now)),
            )
            .values(status="running", lease_owner=owner, lease_expires_at=until, started_at=now)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    async def renew_turn(self, *, turn_id: str, owner: str, until: datetime) -> bool:
        """Move the lease end of a turn this process runs (later: renewed; now: given up, so that
        another may claim it at once); False once another took it over."""
        result = await self.session.execute(
            update(Turn)
            .where(Turn.id == turn_id, Turn.lease_owner == owner, Turn.status == "running")
            .values(lease_expires_at=until)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    async def request_cancel(self, *, turn_id: str, now: datetime) -> None:
        """Mark a queued or running turn to be cancelled (its runner stops it, wherever it runs)."""
        await self.session.execute(
            update(Turn)
            .where(
                Turn.id == turn_id, Turn.status.in_(("queued", "running")), Turn.cancel_requested_at.is_(None)
            )
            .values(cancel_requested_at=now)
            .execution_options(synchronize_session=False)
        )

    async def cancel_requested(self, *, turn_id: str) -> bool:
        result = await self.session.execute(select(Turn.cancel_requested_at).where(Turn.id == turn_id))
        return result.scalar_one_or_none() is not None

    async def finish_unclaimed(self, *, turn_id: str, status: str, now: datetime) -> bool:
        """End a turn nobody runs (queued, or running under an expired lease) without running it."""
        result = await self.session.execute(
            update(Turn)
            .where(
                Turn.id == turn_id,
                or_(Turn.status == "queued", and_(Turn.status == "running", Turn.lease_expires_at < now)),
            )
            .values(status=status, finished_at=now, lease_owner=None, lease_expires_at=None)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    async def finish_running(
        self, *, turn_id: str, status: str, error: dict[str, Any] | None, now: datetime
    ) -> bool:
        """End a running turn whatever its lease (its own runner gives it up)."""
        result = await self.session.execute(
            update(Turn)
            .where(Turn.id == turn_id, Turn.status == "running")
            .values(status=status, error=error, finished_at=now, lease_owner=None, lease_expires_at=None)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    async def stale_turns(
        self, *, now: datetime, queued_before: datetime, limit: int = 100
    ) -> list[tuple[Turn, str]]:
        """Turns whose runner is gone (running, lease expired) or that waited too long in the
        queue, each with its tenant."""
        result = await self.session.execute(
            select(Turn, Conversation.tenant)
            .join(Conversation, Conversation.id == Turn.conversation_id)
            .where(
                or_(
                    and_(Turn.status == "running", Turn.lease_expires_at < now),
                    and_(Turn.status == "queued", Turn.created_at < queued_before),
                )
            )
            .order_by(Turn.created_at)
            .limit(limit)
        )
        return [(row, tenant) for row, tenant in result.all()]

    async def has_active_turn(self, *, conversation_id: str, now: datetime) -> bool:
        """Whether a turn of the conversation is queued, or running under a live lease (a runner
        that died leaves a lapsed lease: the recovery sweep ends or reruns that turn)."""
        result = await self.session.execute(
            select(Turn.id).where(Turn.conversation_id == conversation_id, _live_turn(now)).limit(1)
        )
        return result.first() is not None

    # -- finding conversations and changing their metadata --------------------------------------

    async def search(
        self,
        *,
        tenant: str,
        status: str | None,
        persona: str | None,
        metadata: Mapping[str, str],
        before: tuple[datetime, str] | None,
        limit: int,
    ) -> Sequence[Conversation]:
        """The tenant's conversations matching every filter, newest first (``created_at``, then ``id``),
        from just after the ``before`` position on. The runtime snapshot, the largest column and not
        part of the listing, is never read (raiseload: an accidental access fails loudly)."""
        query = (
            select(Conversation)
            .options(defer(Conversation.snapshot, raiseload=True))
            .where(Conversation.tenant == tenant)
        )
        if status is not None:
            query = query.where(Conversation.status == status)
        if persona is not None:
            query = query.where(Conversation.persona == persona)
        dialect = self.session.get_bind().dialect.name
        for key, value in metadata.items():
            query = query.where(_metadata_matches(dialect, key=key, value=value))
        if before is not None:
            created_at, conversation_id = before
            query = query.where(
                or_(
                    Conversation.created_at < created_at,
                    and_(Conversation.created_at == created_at, Conversation.id < conversation_id),
                )
            )
        query = query.order_by(Conversation.created_at.desc(), Conversation.id.desc()).limit(limit)
        return (await self.session.execute(query)).scalars().all()

    async def metadata_state(
        self, *, tenant: str, conversation_id: str
    ) -> tuple[dict[str, Any], datetime, int] | None:
        """The stored ``(metadata, updated_at, version)`` as of now, for a compare-and-set update.

        PostgreSQL locks the row until the transaction ends (``FOR UPDATE``), so concurrent
        read-merge-writes queue instead of overtaking each other's reads: with many writers at once
        the last one would otherwise lose every compare-and-set it tried. SQLite has no row locks
        (its writers serialize on the database) and SQLAlchemy leaves the clause out there."""
        result = await self.session.execute(
            select(Conversation.metadata_, Conversation.updated_at, Conversation.version)
            .where(Conversation.id == conversation_id, Conversation.tenant == tenant)
            .with_for_update()
        )
        row = result.first()
        return None if row is None else (dict(row[0] or {}), row[1], row[2])

    async def replace_metadata(
        self,
        *,
        conversation_id: str,
        metadata: dict[str, Any],
        seen_updated_at: datetime,
        version: int | None,
        updated_at: datetime,
    ) -> bool:
        """Store ``metadata`` if the row is still as read (its ``updated_at``, and ``version`` when
        given); False when something changed it in between, so the caller reads and merges again.

        A plain UPDATE, not an ORM flush: the ORM would check and could bump the optimistic-lock
        ``version``, which belongs to turns (see ``ConversationService.update_metadata``)."""
        conditions = [Conversation.id == conversation_id, Conversation.updated_at == seen_updated_at]
        if version is not None:
            conditions.append(Conversation.version == version)
        result = await self.session.execute(
            update(Conversation)
            .where(*conditions)
            .values(metadata_=metadata, updated_at=updated_at)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))


def _metadata_matches(dialect: str, *, key: str, value: str) -> ColumnElement[bool]:
    """SQL: the metadata value under ``key`` is a scalar whose JSON text is ``value`` (a string's
    text without its quotes): ``"gold"`` matches ``gold``, ``5`` and ``"5"`` match ``5``, ``true``
    matches ``true``; null never matches.

    PostgreSQL's ``->>`` gives exactly that text (a ``json`` column keeps each number as written).
    SQLite's JSON functions give typed values instead, and its JSON paths cannot name every key (a
    ``"`` in it), so there the key is found with ``json_each`` and the value is compared by type,
    each type against ``value`` read as that type only when ``value`` is how Python's ``json`` (which
    wrote the column) spells it: both stores then agree on every value.
    """
    if dialect == "postgresql":
        return Conversation.metadata_.op("->>")(key) == value
    entry = func.json_each(Conversation.metadata_).table_valued("key", "type", "atom").alias("entry")
    same = [and_(entry.c.type == "text", entry.c.atom == value)]
    if value in ("true", "false"):
        same.append(entry.c.type == value)
    as_int = _canonical_int(value)
    if as_int is not None:
        same.append(and_(entry.c.type == "integer", entry.c.atom == as_int))
    as_float = _canonical_float(value)
    if as_float is not None:
        same.append(and_(entry.c.type == "real", entry.c.atom == as_float))
    return select(entry.c.key).where(entry.c.key == key, or_(*same)).exists()


def _canonical_int(text: str) -> int | None:
    """``text`` as an integer if it is exactly how ``json.dumps`` writes that integer. Stored metadata
    keeps to 64 bits, and SQLite cannot bind a larger one (an OverflowError, a 500): only as text."""
    try:
        number = int(text)
    except ValueError:
        return None
    return number if str(number) == text and INT64_MIN <= number <= INT64_MAX else None


def _canonical_float(text: str) -> float | None:
    """``text`` as a float if it is exactly how ``json.dumps`` writes that float (``repr``)."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) and repr(number) == text else None


# The hot-path statements below are on the tables, not the mapped classes: SQLAlchemy's ORM layer
# adds 0.04-0.1 ms of CPU to each statement it executes (0.24 -> 0.17 ms for an UPDATE, 0.16 ->
# 0.12 ms for the history SELECT against PostgreSQL); only ``_GET`` builds an object.
_CONVERSATIONS = cast(Table, Conversation.__table__)
_TURNS = cast(Table, Turn.__table__)
_MESSAGES = cast(Table, Message.__table__)
_EVENTS = cast(Table, Event.__table__)


def _live_turn(now: datetime | ColumnElement[Any]) -> ColumnElement[bool]:
    """A turn that holds its conversation: queued, or running under a lease that has not lapsed."""
    turns = _TURNS.c
    return or_(turns.status == "queued", and_(turns.status == "running", turns.lease_expires_at >= now))


# The statements every turn runs, built once with named parameters: SQLAlchemy then neither builds
# them nor computes their cache keys per request, which was half their CPU (turn_state 0.55 ->
# 0.26 ms, history 0.34 -> 0.19 ms against PostgreSQL). A parameter compared with a column takes
# that column's type, so each store converts it as it would a literal value.
_ID: BindParameter[str] = bindparam("conversation_id")
_GET = select(Conversation).where(Conversation.id == _ID, Conversation.tenant == bindparam("tenant"))
_LAST_EVENT_SEQ = (
    select(func.coalesce(func.max(_EVENTS.c.seq), 0))
    .where(_EVENTS.c.conversation_id == _ID)
    .scalar_subquery()
)
_HELD = select(_TURNS.c.id).where(_TURNS.c.conversation_id == _ID, _live_turn(bindparam("now"))).exists()
_TURN_STATE = select(_CONVERSATIONS.c.version, _LAST_EVENT_SEQ, _HELD).where(_CONVERSATIONS.c.id == _ID)
_TURN_COLUMNS: tuple[str, ...] = tuple(column.name for column in _TURNS.columns)
# start_turn: the turn's row is selected from its conversation's, so it exists only if the
# conversation is still at the version read before the lock and no live turn holds it.
_START_TURN = (
    insert(_TURNS)
    .from_select(
        _TURN_COLUMNS,
        select(*(bindparam(f"new_{name}", type_=_TURNS.c[name].type) for name in _TURN_COLUMNS)).where(
            _CONVERSATIONS.c.id == _ID, _CONVERSATIONS.c.version == bindparam("seen_version"), ~_HELD
        ),
    )
    .returning(_LAST_EVENT_SEQ.label("last_seq"))
)
# PostgreSQL: start_turn and the history in one statement; the messages are read in the snapshot
# the INSERT checked the conversation's version in (this statement's own).
_STARTED = _START_TURN.cte("started")
_START_TURN_WITH_HISTORY = (
    select(_STARTED.c.last_seq, _MESSAGES.c.role, _MESSAGES.c.parts)
    .select_from(_STARTED.outerjoin(_MESSAGES, _MESSAGES.c.conversation_id == _ID))
    .order_by(_MESSAGES.c.seq)
)
_INSERT_CONVERSATION = insert(_CONVERSATIONS)
_INSERT_TURN = insert(_TURNS)
_INSERT_MESSAGE = insert(_MESSAGES)
# PostgreSQL: messages given as one array per column (``app.kit.given_rows``), so they go into a
# statement with others.
_MESSAGE_COLUMNS = [column.name for column in _MESSAGES.columns]
_SELECT_GIVEN_MESSAGES = given_rows(_MESSAGES, prefix="messages", json_column="parts")
_INSERT_MESSAGES_GIVEN = insert(_MESSAGES).from_select(_MESSAGE_COLUMNS, _SELECT_GIVEN_MESSAGES)
_HISTORY = (
    select(_MESSAGES.c.role, _MESSAGES.c.parts)
    .where(_MESSAGES.c.conversation_id == _ID)
    .order_by(_MESSAGES.c.seq)
)


def _column_values(row: Conversation | Turn) -> dict[str, Any]:
    """The column values an ORM object was given, by column name (``metadata_`` is ``metadata``)."""
    given = instance_state(row).dict
    return {
        prop.columns[0].name: given[prop.key]
        for prop in type(row).__mapper__.column_attrs
        if prop.key in given
    }


@functools.cache
def _finish_conversation(attributes: tuple[str, ...]) -> Update:
    """The UPDATE of a conversation a turn ends (``conversation_<attribute>`` parameters), built
    once per set of attributes; the version it checks is the one the turn started from."""
    columns = Conversation.__mapper__.column_attrs
    return (
        update(_CONVERSATIONS)
        .where(_CONVERSATIONS.c.id == bindparam("finished_conversation_id"))
        .where(_CONVERSATIONS.c.version == bindparam("seen_version"))
        .values({columns[key].columns[0]: bindparam(f"conversation_{key}") for key in attributes})
    )


@functools.cache
def _finish_postgres(attributes: tuple[str, ...], columns: tuple[str, ...]) -> Select[Any]:
    """PostgreSQL: the conversation's UPDATE, the turn's and the messages' INSERT (only if the first
    matched) as one statement, which returns the turn's row."""
    conversation = _finish_conversation(attributes).returning(_CONVERSATIONS.c.id).cte("ended_conversation")
    written = select(conversation.c.id).exists()
    turn = _finish_turn(columns).where(written).cte("ended_turn")
    # Only then the messages too: a stale turn's would collide with those of the turn that took over.
    messages = insert(_MESSAGES).from_select(_MESSAGE_COLUMNS, _SELECT_GIVEN_MESSAGES.where(written))
    # The events only with the turn's row (joined to it: none when it is gone), the end event's
    # data as the row says (``cancelled_end``).
    given = SELECT_GIVEN_EVENTS.subquery("given_events_rows")
    cancelled = and_(given.c.id == bindparam("end_event_id"), turn.c.cancel_requested_at.is_not(None))
    data = case((cancelled, sql_cast(bindparam("end_event_cancelled", type_=Text), JSON)), else_=given.c.data)
    events = insert(EVENTS_TABLE).from_select(
        EVENT_COLUMNS,
        select(*(data if name == "data" else given.c[name] for name in EVENT_COLUMNS)).select_from(
            given.join(turn, true())
        ),
    )
    # No row: the conversation was not written; a row of NULLs: the turn's row is gone.
    return (
        select(*turn.c)
        .select_from(conversation.outerjoin(turn, true()))
        .add_cte(messages.cte("new_messages"), events.cte("new_events"))
    )


@functools.cache
def _insert_new(conversation_columns: tuple[str, ...], turn_columns: tuple[str, ...]) -> Insert:
    """PostgreSQL: a new conversation's, its first turn's, its messages' and its events' INSERTs
    as one statement (foreign keys are checked at its end)."""
    conversation = (
        insert(_CONVERSATIONS)
        .values(
            {
                name: bindparam(f"conversation_{name}", type_=_CONVERSATIONS.c[name].type)
                for name in conversation_columns
            }
        )
        .cte("new_conversation")
    )
    turn = (
        insert(_TURNS)
        .values({name: bindparam(f"turn_{name}", type_=_TURNS.c[name].type) for name in turn_columns})
        .cte("new_turn")
    )
    # The turn's CTE last: SQLAlchemy fills the Python-side defaults (its usage, warnings, ...)
    # of the last DML it compiles only (crud.py: one prefetch list per statement), and the turn
    # is the one that leaves columns to them (test_insert_new_stores_what_was_given... holds it).
    return _INSERT_MESSAGES_GIVEN.add_cte(INSERT_GIVEN_EVENTS.cte("new_events"), conversation, turn)


def _message_arrays(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Messages as one list per column for ``_SELECT_GIVEN_MESSAGES`` (parts as their JSON text)."""
    return row_arrays(rows, _MESSAGES, prefix="messages", json_column="parts")


@functools.cache
def _finish_turn(columns: tuple[str, ...]) -> Update:
    """The UPDATE of the turn ``finish`` ends, built once per set of columns (``turn_<column>``
    parameters: a parameter may not bear a column's name in an UPDATE's SET); RETURNING its row."""
    return (
        update(_TURNS)
        .where(_TURNS.c.id == bindparam("finished_turn_id"))
        .values({_TURNS.c[column]: bindparam(f"turn_{column}") for column in columns})
        .returning(*_TURNS.columns)
    )
