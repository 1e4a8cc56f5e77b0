"""Conversations' metadata stored with a lone surrogate (before request bodies refused them) mended

A ``\\ud800`` escape without its pair made every answer that carried the row a 500 (mended since
on read), and, on PostgreSQL, every listing of the tenant's conversations with a metadata filter
too: its JSON operators refuse the escape inside the query, where no read-side mending reaches.
Each such lone surrogate becomes U+FFFD. Only ``conversations.metadata`` is queried that way.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

import json
import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LONE = re.compile("[\ud800-\udfff]")  # a pair is decoded into one code point: what is left is alone


def _mended(value: Any) -> Any:
    # app.kit.json_body mends on read the same way; a migration keeps its own copy, as it must
    # run the same whatever the application's code becomes.
    if isinstance(value, str):
        return _LONE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_LONE.sub("\ufffd", key): _mended(child) for key, child in value.items()}
    if isinstance(value, list):
        return [_mended(child) for child in value]
    return value


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        # The escape's text (a pair's too: the walk then finds nothing to mend).
        escaped = r"'\\u[dD][89a-fA-F]'"
        found = bind.execute(
            sa.text(f"SELECT id, metadata::text FROM conversations WHERE metadata::text ~ {escaped}")
        )
        update = sa.text("UPDATE conversations SET metadata = CAST(:metadata AS json) WHERE id = :id")
    else:
        found = bind.execute(sa.text(r"SELECT id, metadata FROM conversations WHERE metadata LIKE '%\u%'"))
        update = sa.text("UPDATE conversations SET metadata = :metadata WHERE id = :id")
    for conversation_id, text in found.fetchall():
        value = json.loads(text)
        mended = _mended(value)
        if mended != value:
            bind.execute(update, {"id": conversation_id, "metadata": json.dumps(mended)})


def downgrade() -> None:
    """Nothing to undo: the replaced characters were not valid Unicode."""
