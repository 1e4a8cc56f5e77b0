"""One turn of a conversation: a user message or a resume, run until it completes, pauses or fails."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.clock import utcnow
from app.kit.db import Base


class Turn(Base):
    __tablename__ = "turns"
    __table_args__ = (Index("ix_turns_conversation_created", "conversation_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("conversations.id", ondelete="CASCADE")
    )
    # queued | running | completed | awaiting_tool_results | failed | cancelled
    status: Mapped[str] = mapped_column(String(32))
    output: Mapped[str | None] = mapped_column(Text, default=None)
    error: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    usage: Mapped[dict[str, Any]] = mapped_column(default=dict)
    warnings: Mapped[list[Any]] = mapped_column(default=list)
    version: Mapped[int] = mapped_column(Integer)
    # What a queued (background) turn runs: its new messages and the block it resumes, if any.
    request: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    background: Mapped[bool] = mapped_column(default=False)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    # Who runs it now (a process id), and until when: a dead runner's turn is taken over after it.
    lease_owner: Mapped[str | None] = mapped_column(String(64), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
