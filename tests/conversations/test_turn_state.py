"""The turn's hot-path reads (prebuilt statements with named parameters) on both stores: a lease
compared with ``now`` as the column's type (SQLite stores datetimes as text), the last event seq,
the history in order, another tenant's id as no conversation; and the row lock of a metadata read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession

from app.conversations.repository import ConversationRepository
from app.events.repository import EventRepository
from app.kit.clock import utcnow
from app.kit.db import create_engine, create_sessionmaker
from app.kit.ids import new_id
from app.models import Conversation, Event, Message, Turn
from tests.conversations.rows import conversation_row


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue({"sqlite": "sqlite_url", "postgres": "postgres_url"}[request.param]))


@pytest.fixture
async def session(url: str) -> AsyncIterator[AsyncSession]:
    engine = create_engine(url)
    try:
        async with create_sessionmaker(engine)() as session:
            yield session
    finally:
        await engine.dispose()


def _turn(conversation_id: str, *, status: str, lease: timedelta | None) -> Turn:
    now = utcnow()
    return Turn(
        id=new_id("turn"),
        conversation_id=conversation_id,
        status=status,
        background=True,
        version=0,
        lease_owner="w" if lease is not None else None,
        lease_expires_at=now + lease if lease is not None else None,
        created_at=now,
        started_at=now,
    )


def _event(conversation_id: str, *, seq: int) -> Event:
    return Event(
        id=new_id("evt"),
        conversation_id=conversation_id,
        seq=seq,
        turn_id="turn_x",
        type="x",
        data={},
        created_at=utcnow(),
    )


async def test_turn_state_sees_live_leases_and_not_lapsed_ones(session: AsyncSession) -> None:
    repo = ConversationRepository(session)
    conversation = conversation_row("t", version=3)
    session.add(conversation)
    await session.flush()
    now = utcnow()
    state = await repo.turn_state(conversation_id=conversation.id, now=now)
    assert state is not None
    assert (state.version, state.last_event_seq, state.active_turn) == (3, 0, False)

    # A running turn whose lease lapsed a second ago does not hold the conversation.
    session.add(_turn(conversation.id, status="running", lease=timedelta(seconds=-1)))
    await session.flush()
    state = await repo.turn_state(conversation_id=conversation.id, now=utcnow())
    assert state is not None
    assert not state.active_turn
    # One whose lease runs a second more does (compared within the same second, to the microsecond).
    live = _turn(conversation.id, status="running", lease=timedelta(seconds=1))
    session.add(live)
    await session.flush()
    state = await repo.turn_state(conversation_id=conversation.id, now=utcnow())
    assert state is not None
    assert state.active_turn
    assert live.lease_expires_at is not None
    later = await repo.turn_state(
        conversation_id=conversation.id, now=live.lease_expires_at + timedelta(microseconds=1)
    )
    assert later is not None
    assert not later.active_turn

    session.add(_event(conversation.id, seq=7))
    await session.flush()
    state = await repo.turn_state(conversation_id=conversation.id, now=now)
    assert state is not None
    assert state.last_event_seq == 7
    assert await repo.turn_state(conversation_id=new_id("conv"), now=now) is None
    await session.rollback()


async def test_history_is_in_order_and_get_is_per_tenant(session: AsyncSession) -> None:
    repo = ConversationRepository(session)
    conversation = conversation_row("t", version=3)
    session.add(conversation)
    await session.flush()
    now = utcnow()
    for seq, role in ((2, "assistant"), (1, "user")):
        session.add(
            Message(
                id=new_id("msg"),
                conversation_id=conversation.id,
                seq=seq,
                turn_id="turn_x",
                role=role,
                parts=[{"type": "text", "text": str(seq)}],
                created_at=now,
            )
        )
    await session.flush()
    history = await repo.history(conversation_id=conversation.id)
    assert [role for role, _ in history] == ["user", "assistant"]
    assert await repo.get(tenant="t", conversation_id=conversation.id) is conversation
    assert await repo.get(tenant="other", conversation_id=conversation.id) is None
    await session.rollback()


async def test_finish_stores_each_turn_column_as_its_type(session: AsyncSession) -> None:
    """The prebuilt UPDATE's parameters take their columns' types: JSON objects and lists come
    back as such, datetimes as datetimes, None as NULL, on both stores; a gone turn is told."""
    repo = ConversationRepository(session)
    conversation = conversation_row("t", version=3)
    session.add(conversation)
    turn = _turn(conversation.id, status="running", lease=timedelta(seconds=30))
    session.add(turn)
    await session.flush()
    finished_at = utcnow()
    values = {
        "status": "failed",
        "output": "partial ✓",
        "error": {"code": "x", "message": "it broke", "retryable": False},
        "usage": {"input_tokens": 3, "output_tokens": 4, "llm_calls": 1, "iterations": 1},
        "warnings": ["w1", {"k": [1, 2]}],
        "version": 4,
        "finished_at": finished_at,
        "lease_owner": None,
        "lease_expires_at": None,
    }
    row = await repo.finish(
        conversation, seen_version=3, values={"version": 4}, turn_id=turn.id, finished=values, messages=[]
    )
    assert isinstance(row, Turn)
    missing = new_id("turn")
    gone = await repo.finish(
        conversation, seen_version=4, values={"version": 5}, turn_id=missing, finished=values, messages=[]
    )
    assert gone == "gone"
    session.expunge_all()
    stored = await session.get(Turn, turn.id)
    assert stored is not None
    for found in (row, stored):
        assert {key: getattr(found, key) for key in values if key != "finished_at"} == {
            key: value for key, value in values.items() if key != "finished_at"
        }
        assert found.finished_at is not None
        assert found.finished_at.replace(tzinfo=None) == finished_at.replace(tzinfo=None)
    await session.rollback()


async def test_a_metadata_read_holds_the_row_until_its_write_commits(postgres_url: str) -> None:
    """PostgreSQL: the read of a metadata read-merge-write locks the row, so a second one waits for
    the first to commit and merges into what it wrote (it cannot read the same state, lose its
    compare-and-set and, after a few such rounds among many writers, give up with a 409)."""
    engine = create_engine(postgres_url)
    maker = create_sessionmaker(engine)
    conversation = conversation_row("t")
    try:
        async with maker() as setup, setup.begin():
            setup.add(conversation)
        async with maker() as first, maker() as second:
            read = await ConversationRepository(first).metadata_state(
                tenant="t", conversation_id=conversation.id
            )
            assert read is not None
            waiting = asyncio.ensure_future(
                ConversationRepository(second).metadata_state(tenant="t", conversation_id=conversation.id)
            )
            await asyncio.sleep(0.3)
            assert not waiting.done(), "the second read did not wait for the first writer"
            assert await ConversationRepository(first).replace_metadata(
                conversation_id=conversation.id,
                metadata={"first": 1},
                seen_updated_at=read[1],
                version=None,
                updated_at=read[1] + timedelta(microseconds=1),
            )
            await first.commit()
            second_read = await asyncio.wait_for(waiting, timeout=10)
            assert second_read is not None
            assert second_read[0] == {"first": 1}
            await second.rollback()
    finally:
        await engine.dispose()


def _running_values(conversation_id: str, *, version: int) -> dict[str, object]:
    """Every column of a turn stored as running by ``start_turn`` (a lease of 30 s)."""
    now = utcnow()
    return {
        "id": new_id("turn"),
        "conversation_id": conversation_id,
        "status": "running",
        "output": None,
        "error": None,
        "usage": {"input_tokens": 0, "llm_calls": 0},
        "warnings": [],
        "version": version,
        "request": None,
        "background": False,
        "cancel_requested_at": None,
        "lease_owner": "replica-1",
        "lease_expires_at": now + timedelta(seconds=30),
        "started_at": now,
        "created_at": now,
        "finished_at": None,
    }


async def test_start_turn_checks_and_writes_in_one_statement(session: AsyncSession) -> None:
    """A turn is stored as running only while its conversation is at the version read before the
    lock and no live turn holds it; it returns the last event seq, every column as its type."""
    repo = ConversationRepository(session)
    conversation = conversation_row("t", version=3)
    session.add(conversation)
    await session.flush()
    session.add(_event(conversation.id, seq=4))
    await session.flush()

    # The conversation moved on (another turn finished while this request waited): nothing written.
    stale = _running_values(conversation.id, version=2)
    assert await repo.start_turn(stale, seen_version=2, now=utcnow()) is None
    assert await session.get(Turn, stale["id"]) is None

    # A queued (detached) turn holds the conversation whatever the lock says.
    queued = _turn(conversation.id, status="queued", lease=None)
    session.add(queued)
    await session.flush()
    held = _running_values(conversation.id, version=3)
    assert await repo.start_turn(held, seen_version=3, now=utcnow()) is None
    assert await session.get(Turn, held["id"]) is None
    await session.delete(queued)
    # A running one whose lease lapsed does not.
    session.add(_turn(conversation.id, status="running", lease=timedelta(seconds=-1)))
    await session.flush()

    values = _running_values(conversation.id, version=3)
    assert await repo.start_turn(values, seen_version=3, now=utcnow()) == 4
    stored = await session.get(Turn, values["id"])
    assert stored is not None
    await session.refresh(stored)
    assert {column: getattr(stored, column) for column in values} == values
    # Now that one holds it: a second start is refused.
    second = _running_values(conversation.id, version=3)
    assert await repo.start_turn(second, seen_version=3, now=utcnow()) is None
    # A deleted (or never existing) conversation gets no turn.
    gone = _running_values(new_id("conv"), version=0)
    assert await repo.start_turn(gone, seen_version=0, now=utcnow()) is None
    await session.rollback()


async def test_start_turn_reading_history_checks_writes_and_reads(session: AsyncSession) -> None:
    """The same checks as ``start_turn`` (on PostgreSQL in the statement that also reads the
    history): nothing written and no history when one fails; else the last event seq and the
    messages in order, or none for a conversation that has none yet."""
    repo = ConversationRepository(session)
    conversation = conversation_row("t", version=3)
    session.add(conversation)
    await session.flush()
    empty = _running_values(conversation.id, version=3)
    assert await repo.start_turn_reading_history(empty, seen_version=3, now=utcnow()) == (0, [])
    await session.execute(delete(Turn).where(Turn.id == empty["id"]))
    earlier = _turn(conversation.id, status="completed", lease=None)
    session.add(earlier)
    session.add(_event(conversation.id, seq=7))
    await session.flush()
    messages = [_message(conversation.id, earlier.id, seq) for seq in (2, 0, 1)]
    await repo.insert_messages(messages)

    stale = _running_values(conversation.id, version=2)
    assert await repo.start_turn_reading_history(stale, seen_version=2, now=utcnow()) is None
    assert await session.get(Turn, stale["id"]) is None
    values = _running_values(conversation.id, version=3)
    started = await repo.start_turn_reading_history(values, seen_version=3, now=utcnow())
    assert started is not None
    last_seq, history = started
    assert last_seq == 7
    ordered = sorted(messages, key=lambda m: int(str(m["seq"])))
    assert history == [(m["role"], m["parts"]) for m in ordered]
    assert await session.get(Turn, values["id"]) is not None
    # It holds the conversation now: another start is refused, and reads nothing.
    second = _running_values(conversation.id, version=3)
    assert await repo.start_turn_reading_history(second, seen_version=3, now=utcnow()) is None
    await session.rollback()


def _message(conversation_id: str, turn_id: str, seq: int) -> dict[str, object]:
    return {
        "id": new_id("msg"),
        "conversation_id": conversation_id,
        "seq": seq,
        "turn_id": turn_id,
        "role": "assistant",
        "parts": [{"type": "text", "text": f"ünïcode {seq} \" ' \\"}],
        "created_at": utcnow(),
    }


async def test_finish_checks_the_version_and_leaves_the_object_clean(session: AsyncSession) -> None:
    """A turn's outcome (conversation, turn, messages) is stored only from the version the turn
    started at: a turn whose lease lapsed and was taken over writes nothing. Once stored, the
    turn's row comes back as stored, the messages are there as given, and the loaded object holds
    the values without being dirty (no later flush writes them again)."""
    repo = ConversationRepository(session)
    conversation = conversation_row("t", version=3)
    session.add(conversation)
    turn = _turn(conversation.id, status="running", lease=timedelta(seconds=30))
    session.add(turn)
    await session.flush()
    values = {"version": 4, "next_seq": 2, "snapshot": b"\x00ns", "paused": {"k": [1]}, "status": "idle"}
    finished = {"status": "completed", "output": "done", "usage": {"llm_calls": 1}, "version": 4}
    messages = [_message(conversation.id, turn.id, 0), _message(conversation.id, turn.id, 1)]

    refused = await repo.finish(
        conversation, seen_version=2, values=values, turn_id=turn.id, finished=finished, messages=messages
    )
    assert refused == "stale"
    await session.rollback()  # what the service does with a stale outcome
    session.add(conversation := conversation_row("t", version=3))
    session.add(turn := _turn(conversation.id, status="running", lease=timedelta(seconds=30)))
    await session.flush()
    messages = [_message(conversation.id, turn.id, 0), _message(conversation.id, turn.id, 1)]

    row = await repo.finish(
        conversation, seen_version=3, values=values, turn_id=turn.id, finished=finished, messages=messages
    )
    assert isinstance(row, Turn)
    assert (row.status, row.output, row.usage, row.version, row.background) == (
        "completed",
        "done",
        {"llm_calls": 1},
        4,
        True,
    )
    assert (conversation.version, conversation.next_seq, conversation.paused) == (4, 2, {"k": [1]})
    assert not session.dirty
    session.expire(conversation)
    await session.refresh(conversation)
    assert (conversation.version, conversation.next_seq, conversation.snapshot) == (4, 2, b"\x00ns")
    assert conversation.paused == {"k": [1]}
    stored = await repo.messages(conversation_id=conversation.id)
    assert [(m.id, m.seq, m.parts, m.created_at) for m in stored] == [
        (m["id"], m["seq"], m["parts"], m["created_at"]) for m in messages
    ]
    # Refused: a turn that also started from 3 (its lease lapsed, another turn took over and wrote
    # 4), though it would write the same version; and one writing 5 from 3.
    for version, given in ((4, messages), (5, [])):
        refused = await repo.finish(
            conversation,
            seen_version=3,
            values={"version": version},
            turn_id=turn.id,
            finished=finished,
            messages=given,
        )
        assert refused == "stale"
    # A turn row gone missing: the conversation is written, the caller stores the turn again.
    await session.execute(delete(Turn).where(Turn.id == turn.id))
    gone = await repo.finish(
        conversation, seen_version=4, values={"version": 5}, turn_id=turn.id, finished=finished, messages=[]
    )
    assert gone == "gone"
    assert conversation.version == 5
    await session.rollback()


async def test_insert_new_stores_what_was_given_and_defaults_the_rest(session: AsyncSession) -> None:
    repo = ConversationRepository(session)
    conversation = conversation_row("t", version=1)
    conversation.metadata_ = {"team": "a"}
    turn = _turn(conversation.id, status="completed", lease=None)
    messages = [_message(conversation.id, turn.id, 0)]
    events = [
        {
            "id": f"evt_{index}_{conversation.id}",
            "conversation_id": conversation.id,
            "seq": index + 1,
            "turn_id": turn.id,
            "parent_id": None if index == 0 else f"evt_0_{conversation.id}",
            "type": kind,
            "data": {"text": "a\x00b \U0001f600", "n": index},
            "created_at": utcnow(),
        }
        for index, kind in enumerate(("turn.started", "turn.completed"))
    ]
    await repo.insert_new(conversation, turn, messages, events=events)
    assert conversation not in session  # never attached: Core statements
    stored = await repo.get(tenant="t", conversation_id=conversation.id)
    assert stored is not None
    assert (stored.version, stored.metadata_, stored.lock_turn_id, stored.snapshot) == (
        1,
        {"team": "a"},
        None,
        None,
    )
    row = await session.get(Turn, turn.id)
    assert row is not None
    assert (row.status, row.usage, row.warnings, row.background) == ("completed", {}, [], True)
    assert [(m.id, m.parts) for m in await repo.messages(conversation_id=conversation.id)] == [
        (messages[0]["id"], messages[0]["parts"])
    ]
    stored_events = await EventRepository(session).page(conversation_id=conversation.id, after=0, limit=10)
    assert [(e.id, e.seq, e.parent_id, e.type, e.data) for e in stored_events] == [
        (e["id"], e["seq"], e["parent_id"], e["type"], e["data"]) for e in events
    ]
    await session.rollback()


def _turn_events(conversation_id: str, turn_id: str) -> list[dict[str, object]]:
    """A turn's last events as the service hands them to ``finish``: its end event last."""
    return [
        {
            "id": new_id("evt"),
            "conversation_id": conversation_id,
            "seq": 10 + index,
            "turn_id": turn_id,
            "parent_id": None,
            "type": kind,
            "data": {"text": "a\x00b \U0001f600", "cancel_requested": False, "n": index},
            "created_at": utcnow(),
        }
        for index, kind in enumerate(("block.completed", "turn.completed"))
    ]


async def _stored_events(session: AsyncSession, conversation_id: str) -> list[tuple[object, ...]]:
    found = await EventRepository(session).page(conversation_id=conversation_id, after=0, limit=10)
    return [(e.id, e.seq, e.type, e.data) for e in found]


async def test_finish_stores_the_turns_events_with_the_end_event_its_row_calls_for(
    session: AsyncSession,
) -> None:
    """The turn's last events go with its outcome: as given, unless the row carries a cancel
    request that came while the turn ran (the service cannot know it before the statement), when
    the end event is stored with the data given for that case. A stale outcome stores no event,
    and neither does one whose turn row is gone (the service stores them with the row it makes)."""
    repo = ConversationRepository(session)
    finished = {"status": "completed", "output": "done", "version": 4}

    async def running(*, cancel: bool) -> tuple[Conversation, Turn]:
        conversation = conversation_row("t", version=3)
        session.add(conversation)
        turn = _turn(conversation.id, status="running", lease=timedelta(seconds=30))
        turn.cancel_requested_at = utcnow() if cancel else None
        session.add(turn)
        await session.flush()
        return conversation, turn

    for cancel in (False, True):
        conversation, turn = await running(cancel=cancel)
        events = _turn_events(conversation.id, turn.id)
        cancelled = {**events[-1]["data"], "cancel_requested": True}  # type: ignore[dict-item]
        row = await repo.finish(
            conversation,
            seen_version=3,
            values={"version": 4},
            turn_id=turn.id,
            finished=finished,
            messages=[],
            events=events,
            cancelled_end=cancelled,
        )
        assert isinstance(row, Turn)
        assert (row.cancel_requested_at is not None) is cancel
        expected = [(e["id"], e["seq"], e["type"], e["data"]) for e in events]
        if cancel:
            expected[-1] = (*expected[-1][:3], cancelled)
        assert await _stored_events(session, conversation.id) == expected

    async def finish(conversation: Conversation, turn: Turn, *, seen: int) -> Turn | str:
        return await repo.finish(
            conversation,
            seen_version=seen,
            values={"version": seen + 1},
            turn_id=turn.id,
            finished=finished,
            messages=[],
            events=_turn_events(conversation.id, turn.id),
            cancelled_end={"cancel_requested": True},
        )

    # Stale (another turn wrote version 3 first): nothing of this turn is stored.
    conversation, turn = await running(cancel=False)
    assert await finish(conversation, turn, seen=2) == "stale"
    assert await _stored_events(session, conversation.id) == []
    # Its row gone: the conversation is written, the events are left to the caller.
    await session.execute(delete(Turn).where(Turn.id == turn.id))
    gone = await finish(conversation, turn, seen=3)
    assert gone == "gone"
    assert await _stored_events(session, conversation.id) == []
    await session.rollback()
