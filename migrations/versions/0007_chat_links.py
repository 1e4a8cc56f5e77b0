"""chat_links: the digests of the Chat Completions histories SABRE answered, to continue them

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "chat_links",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("conversation_id", sa.String(length=40), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["conversations.id"],
            name=op.f("fk_chat_links_conversation_id_conversations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant", "digest", name=op.f("pk_chat_links")),
    )
    op.create_index("ix_chat_links_conversation_id", "chat_links", ["conversation_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_chat_links_conversation_id", table_name="chat_links")
    op.drop_table("chat_links")
