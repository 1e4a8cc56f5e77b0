"""One event of a turn, stored in order: ``seq`` is gap-free per conversation, ``parent_id`` makes
the events of a turn a tree (an LLM call, a block, a helper and a sub-task each open a node)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.clock import utcnow
from app.kit.db import Base


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("conversation_id", "seq"),
        Index("ix_events_turn_id", "turn_id"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("conversations.id", ondelete="CASCADE")
    )
    seq: Mapped[int] = mapped_column(Integer)
    turn_id: Mapped[str] = mapped_column(String(40))
    parent_id: Mapped[str | None] = mapped_column(String(40), default=None)
    type: Mapped[str] = mapped_column(String(40))
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
