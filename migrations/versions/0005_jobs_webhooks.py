"""background jobs (procrastinate's schema, PostgreSQL only) and webhooks (conversations.webhook_url,
server_secrets)

procrastinate's tables, types and functions are those of the procrastinate version installed when
this migration runs (pyproject pins the minor version). Upgrading procrastinate to a version whose
schema changed takes a migration of ours that applies its files from
``procrastinate/sql/migrations`` (``procrastinate schema --migrations-path`` lists where).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from procrastinate.schema import SchemaManager

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Everything procrastinate created, found by its prefix in the current schema: tables (their
# triggers and sequences go with them), then functions, then the enum and composite types.
_DROP_PROCRASTINATE = r"""
DO $$
DECLARE
    item record;
BEGIN
    FOR item IN
        SELECT tablename FROM pg_tables
        WHERE schemaname = current_schema() AND tablename LIKE 'procrastinate\_%'
    LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I CASCADE', item.tablename);
    END LOOP;
    FOR item IN
        SELECT p.oid::regprocedure AS signature FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema() AND p.proname LIKE 'procrastinate\_%'
    LOOP
        EXECUTE format('DROP FUNCTION IF EXISTS %s CASCADE', item.signature);
    END LOOP;
    FOR item IN
        SELECT t.typname FROM pg_type t
        JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = current_schema() AND t.typname LIKE 'procrastinate\_%'
          AND t.typtype IN ('e', 'c')
    LOOP
        EXECUTE format('DROP TYPE IF EXISTS %I CASCADE', item.typname);
    END LOOP;
END;
$$;
"""


def _execute_script(script: str) -> None:
    """Run a multi-statement SQL script in the migration's transaction.

    SQLAlchemy's asyncpg adapter prepares every statement, and a prepared statement holds one
    command; the script goes to the asyncpg connection itself (simple query protocol), after a
    statement through SQLAlchemy has opened the migration's transaction on it.
    """
    try:
        from sqlalchemy.util.concurrency import await_
    except ImportError:  # SQLAlchemy 2.0
        from sqlalchemy.util import await_only as await_  # type: ignore[attr-defined,no-redef]

    bind = op.get_bind()
    bind.execute(sa.text("SELECT 1"))
    driver = bind.connection.dbapi_connection.driver_connection  # type: ignore[union-attr]
    await_(driver.execute(script))


def upgrade() -> None:
    op.create_table(
        "server_secrets",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_server_secrets")),
    )
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("webhook_url", sa.String(length=2048), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        # The embedded SQLite store keeps jobs in memory (app.kit.jobs): nothing to create there.
        _execute_script(SchemaManager.get_schema())


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _execute_script(_DROP_PROCRASTINATE)
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.drop_column("webhook_url")
    op.drop_table("server_secrets")
