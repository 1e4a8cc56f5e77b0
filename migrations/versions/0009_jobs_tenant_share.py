"""jobs counted per tenant (PostgreSQL only): the index behind tenants' fair share of the workers

``app.kit.jobs.defer`` counts a tenant's jobs waiting or running on a queue each time it queues one
for that tenant (a background turn, a webhook delivery). The partial index holds those jobs alone,
so the count stays an index lookup however many jobs have ended.

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
            "CREATE INDEX ix_jobs_tenant_pending ON procrastinate_jobs (queue_name, (args->>'tenant')) "
            "WHERE status IN ('todo', 'doing')"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_jobs_tenant_pending")
