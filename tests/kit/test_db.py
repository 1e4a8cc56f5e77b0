"""``autocommit_unit``: on PostgreSQL each statement of the session, until it commits, is its own
transaction (no ``BEGIN`` and ``COMMIT`` round trips); nothing changes on SQLite, nor for a session
whose transaction has begun, nor for the next session on the same pooled connection."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.kit.db import autocommit_unit, create_engine, create_sessionmaker, leave_autocommit
from app.models import Conversation
from tests.conversations.rows import conversation_row


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue({"sqlite": "sqlite_url", "postgres": "postgres_url"}[request.param]))


@pytest.fixture
async def maker(url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(url)
    try:
        yield create_sessionmaker(engine)
    finally:
        await engine.dispose()


async def _written_then_rolled_back(
    maker: async_sessionmaker[AsyncSession],
    *,
    single: bool,
    read_first: bool = False,
    read_after: bool = False,
    leave: bool = False,
) -> bool:
    """Whether a conversation written in a session that then rolls back is stored."""
    row = conversation_row("t", version=1)
    async with maker() as session:
        if read_first:
            await session.execute(select(1))
        if single:
            await autocommit_unit(session)
        if read_after:
            await session.execute(select(Conversation.id).limit(1))
        if leave:
            await leave_autocommit(session)
        session.add(row)
        await session.flush()
        await session.rollback()
    async with maker() as session:
        return await session.get(Conversation, row.id) is not None


async def test_autocommit_unit_runs_the_next_statement_as_its_own_transaction(
    maker: async_sessionmaker[AsyncSession],
) -> None:
    postgres = maker.kw["bind"].dialect.name == "postgresql"
    # PostgreSQL: committed by itself, so the rollback finds nothing to undo.
    assert await _written_then_rolled_back(maker, single=True, read_first=False) is postgres
    # Reads after it are statements of their own too, and so is the write that follows them.
    assert await _written_then_rolled_back(maker, single=True, read_after=True) is postgres
    # Left after a read: the statements after it are one transaction again, undone by the rollback.
    assert await _written_then_rolled_back(maker, single=True, read_after=True, leave=True) is False
    # A session that has read already keeps its transaction: the read and the write are one unit.
    assert await _written_then_rolled_back(maker, single=True, read_first=True) is False
    # The connection goes back to the pool as it was: the next session's write is undone again.
    assert await _written_then_rolled_back(maker, single=False, read_first=False) is False


async def test_leaving_with_changes_pending_is_refused(maker: async_sessionmaker[AsyncSession]) -> None:
    """They would be flushed, and committed on their own, by the commit that leaves."""
    async with maker() as session:
        await autocommit_unit(session)
        await session.execute(select(1))
        session.add(conversation_row("t", version=1))
        if maker.kw["bind"].dialect.name == "postgresql":
            with pytest.raises(RuntimeError, match="pending"):
                await leave_autocommit(session)
        else:
            await leave_autocommit(session)  # never autocommit: nothing to leave
        await session.rollback()
