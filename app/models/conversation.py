"""A conversation: its settings, runtime snapshot, pause state, lock and running totals."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.clock import utcnow
from app.kit.db import Base


class Conversation(Base):
    __tablename__ = "conversations"
    __table_args__ = (Index("ix_conversations_tenant_created", "tenant", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    persona: Mapped[str] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(200), default=None)
    instructions: Mapped[str | None] = mapped_column(Text, default=None)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    max_iterations: Mapped[int] = mapped_column(Integer)
    tools: Mapped[list[Any]] = mapped_column(default=list)
    # Where the ends of its turns are POSTed (app.events.webhooks); None: the tenant's default.
    webhook_url: Mapped[str | None] = mapped_column(String(2048), default=None)
    # idle | awaiting_tool_results (a turn in progress is the lock, not a status)
    status: Mapped[str] = mapped_column(String(32), default="idle")
    version: Mapped[int] = mapped_column(Integer, default=0)
    next_seq: Mapped[int] = mapped_column(Integer, default=0)
    # The namespace after the last block, pickled in the sandbox; opaque bytes to the server.
    snapshot: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    # The paused block (code, pre-block snapshot, replay journal, pending calls), or None.
    paused: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    # Database lock used when no Redis is configured: owner turn id and lease expiry.
    lock_turn_id: Mapped[str | None] = mapped_column(String(40), default=None)
    lock_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    llm_calls: Mapped[int] = mapped_column(Integer, default=0)
    iterations: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    # Every ORM update checks the version it read: a turn whose lease expired cannot overwrite the
    # turn that took over. The service increments it, once per turn.
    __mapper_args__ = {"version_id_col": version, "version_id_generator": False}  # noqa: RUF012
