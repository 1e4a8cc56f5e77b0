"""Database plumbing: the declarative base, engine creation and the request-scoped session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from fastapi import Depends, Request
from sqlalchemy import JSON, DateTime, Dialect, MetaData, TypeDecorator, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase

from app.kit.json_body import load_stored

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Plain JSON on both stores, not JSONB: JSONB reorders object keys, and the order of a tool schema's
# properties is the order positional arguments map onto.
JSONType = JSON()


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on both stores (SQLite keeps no zone of its own)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    """Declarative base of every table; constraint names are deterministic for Alembic."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: dict[Any, Any] = {  # noqa: RUF012 - SQLAlchemy reads it as a class attribute
        dict[str, Any]: JSONType,
        list[Any]: JSONType,
        datetime: UTCDateTime,
    }


APPLICATION_NAME = "sabre"
AUTOCOMMIT: Final = "AUTOCOMMIT"  # the isolation level of a connection with no transactions


def create_engine(
    url: str, *, pre_ping: bool = False, idle_transaction_seconds: float | None = None
) -> AsyncEngine:
    """An async engine tuned for the store behind ``url`` (SQLite: WAL + foreign keys), whose
    errors never carry a statement's values (``hide_parameters``).

    ``pre_ping`` (PostgreSQL): test every connection at checkout, at three round trips each.
    ``idle_transaction_seconds`` (PostgreSQL): the server ends a transaction of ours left idle
    this long. The service passes its lease: a process frozen (a paused VM) or cut off in the
    middle of a transaction has lost its turn by then, and its locks (a row, an unfinished
    insert of the turn's next events) must not stop the process that took the turn over.
    """
    if url.startswith("sqlite"):
        engine = create_async_engine(
            url, connect_args={"timeout": 30}, json_deserializer=load_stored, hide_parameters=True
        )

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    # Named in pg_stat_activity (the job engine's connections are not ours).
    server_settings = {"application_name": APPLICATION_NAME}
    if idle_transaction_seconds is not None:
        server_settings["idle_in_transaction_session_timeout"] = str(
            max(1, int(idle_transaction_seconds * 1000))
        )
    engine = create_async_engine(
        url,
        pool_size=20,
        max_overflow=10,
        pool_pre_ping=pre_ping,
        connect_args={"server_settings": server_settings},
        json_deserializer=load_stored,
        # A statement's error names its values otherwise (messages, snapshots, secrets), and such
        # errors are logged and put on spans.
        hide_parameters=True,
    )

    @event.listens_for(engine.sync_engine, "checkout")
    def _drop_closed(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        # Free (no round trip): a connection the server ended (restart, idle timeout, terminate)
        # is closed on our side too once asyncpg has read the server's goodbye; the pool then
        # takes another. A connection lost silently still fails its request (503, retryable).
        driver = record.driver_connection
        if driver is not None and driver.is_closed():
            raise DisconnectionError("the server closed this pooled connection")

    return engine


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded objects usable after commit (the turn spans commits)."""
    return async_sessionmaker(engine, expire_on_commit=False)


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """The request's unit of work: committed when the endpoint returns, rolled back on error.

    Function-scoped (``Session``): it ends before the response is sent, so a client never gets a
    success for a write that is not committed (nor reads, right after a 2xx, what it just changed
    as it was before: a ``DELETE`` then a ``GET`` found the conversation still there)."""
    maker: async_sessionmaker[AsyncSession] = request.app.state.sessionmaker
    async with maker() as session:
        try:
            yield session
        except BaseException:
            await session.rollback()
            raise
        else:
            await session.commit()


Session = Annotated[AsyncSession, Depends(get_session, scope="function")]


async def autocommit_unit(session: AsyncSession) -> None:
    """The session's unit of work, until it commits, needs no transaction of its own: it writes
    once at most, in one statement, and what it reads before is plain reads (no row locks), which
    under READ COMMITTED take a snapshot each whatever the transaction. On PostgreSQL each
    statement then runs as its own transaction, without the ``BEGIN`` and ``COMMIT`` round trips
    (two of a one-statement unit's three), and the session's commit has nothing left to do.

    The caller must keep to that: a second write would be a transaction of its own too, and an
    ORM change is flushed as one. Nothing changes on SQLite (its ``BEGIN`` is no round trip) or
    once the session's transaction has begun (a read before, e.g. a stored API key's: it stays
    one unit). The pooled connection goes back to transactions when the session commits."""
    if session.in_transaction() or session.get_bind().dialect.name != "postgresql":
        return
    await session.connection(execution_options={"isolation_level": AUTOCOMMIT})


async def leave_autocommit(session: AsyncSession) -> None:
    """A unit begun as an ``autocommit_unit`` that finds it must write more than once: what it
    read stays read (under READ COMMITTED a transaction kept no snapshot of it), and its
    statements from here on are one transaction again (the connection goes back to the pool; the
    next statement begins a transaction on one). Call it before changing anything: an ORM change
    pending now would be flushed as a transaction of its own. Nothing to do otherwise."""
    if not session.in_transaction():
        return
    connection = (await session.connection()).sync_connection
    if connection is None or connection.get_execution_options().get("isolation_level") != AUTOCOMMIT:
        return
    if session.new or session.dirty or session.deleted:
        raise RuntimeError("leave_autocommit with ORM changes pending: they would commit on their own")
    await session.commit()


def store_location(url: str) -> str:
    """Where ``url`` points, safe to print: driver, user, host, port and database, no password."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "an unparsable URL"


def store_problem(url: str, exc: BaseException) -> str:
    """One line saying why the store behind ``url`` cannot be used (start-up, ``sabre migrate``):
    the driver's own error rather than SQLAlchemy's wrapper with its SQL and link."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    reason = " ".join(str(cause).split()) or type(cause).__name__
    if isinstance(cause, TimeoutError):
        reason = "no answer in time"
    return (
        f"The store at {store_location(url)} cannot be used ({type(cause).__name__}: {reason[:300]}). "
        "Check SABRE_DATABASE_URL (e.g. postgresql://user:password@host:5432/db) and that the database runs."
    )
