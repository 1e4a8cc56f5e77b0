"""jobs placed in line per tenant (PostgreSQL only): the indexes behind tenants' fair shares

``app.kit.jobs.defer`` reads where a queue's line stands each time it queues a job for a tenant (a
background turn, a webhook delivery): the priority of the jobs running and waiting on the queue,
and the lowest of the tenant's own. The partial indexes hold the jobs waiting or running alone,
ordered by priority, so each is one index lookup however many jobs have ended.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE INDEX ix_jobs_line ON procrastinate_jobs (queue_name, status, priority) "
            "WHERE status IN ('todo', 'doing')"
        )
        op.execute(
            "CREATE INDEX ix_jobs_tenant_line ON procrastinate_jobs "
            "(queue_name, (args->>'tenant'), priority) WHERE status IN ('todo', 'doing')"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_jobs_tenant_line")
        op.execute("DROP INDEX IF EXISTS ix_jobs_line")
