"""Run Alembic migrations programmatically (``sabre migrate`` and the embedded start-up)."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Final

import structlog
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text

from app.kit.datadir import secure_sqlite_file
from app.kit.db import create_engine

log = structlog.get_logger(__name__)

ROOT = Path(__file__).resolve().parents[2]
MIGRATION_LOCK_KEY: Final = 0x5AB2E_A1E3B1C
"""The PostgreSQL advisory lock (a bigint) every ``upgrade`` of one database takes in turn."""


def alembic_config(database_url: str) -> Config:
    """Alembic configuration pointing at our migrations and the given store."""
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.attributes["database_url"] = database_url
    return config


async def upgrade(database_url: str, *, revision: str = "head") -> None:
    """Upgrade the store behind ``database_url`` to ``revision``.

    Every path that makes the embedded store comes here first (the lifespan, ``sabre migrate``,
    ``sabre keys create``), so this is where its file is created owner-only.
    """
    if database_url.startswith("sqlite"):
        path = database_url.split(":///", 1)[1]
        if path and path != ":memory:":
            secure_sqlite_file(Path(path))
    engine = create_engine(database_url)
    config = alembic_config(database_url)
    async with engine.begin() as connection:

        def _upgrade(sync_connection: Connection) -> None:
            _lock_migrations(sync_connection)
            # Already there (every start of the embedded store but the first): skip Alembic's env.
            if revision == "head" and MigrationContext.configure(sync_connection).get_current_heads() == (
                _head(),
            ):
                return
            config.attributes["connection"] = sync_connection
            command.upgrade(config, revision)

        await connection.run_sync(_upgrade)
    await engine.dispose()


def _lock_migrations(connection: Connection) -> None:
    """On PostgreSQL, hold the migration lock until this transaction ends: replicas started
    together (each running ``sabre migrate``) upgrade one at a time, and one that finds the lock
    taken waits for the winner, then finds the schema at head and does nothing. SQLite's own
    write lock serialises its writers."""
    if connection.dialect.name != "postgresql":
        return
    parameters = {"key": MIGRATION_LOCK_KEY}
    if connection.execute(text("SELECT pg_try_advisory_xact_lock(:key)"), parameters).scalar():
        return
    log.info("migration_waiting", reason="another process is migrating this database")
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), parameters)


@functools.cache
def _head() -> str:
    """The newest revision of our migrations (one, as they form a line)."""
    head = ScriptDirectory.from_config(alembic_config("unused")).get_current_head()
    assert head is not None
    return head


def schema_problem(connection: Connection) -> str | None:
    """Why the store on ``connection`` cannot serve this code (None: its schema is at head):
    a server does not upgrade PostgreSQL itself (``sabre migrate``, once, before the replicas)."""
    current = MigrationContext.configure(connection).get_current_heads()
    if current == (_head(),):
        return None
    found = ", ".join(current) or "no SABRE schema"
    return f"its schema is at {found}, this SABRE needs {_head()}: run `sabre migrate` first"


def upgrade_sync(database_url: str, *, revision: str = "head") -> None:
    """Blocking wrapper for the command line."""
    asyncio.run(upgrade(database_url, revision=revision))
