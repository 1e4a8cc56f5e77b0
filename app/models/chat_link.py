"""Where a Chat Completions history continues: the digest of a history SABRE answered, per tenant.

A Chat Completions client sends the whole dialogue every time. After each answer SABRE stores the
digest of that dialogue (the request's messages and its own answer) with the conversation and the
version it reached; the next request whose history up to its last assistant message has that digest
continues the conversation, if it is still at that version (``app.openai_compat``).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.clock import utcnow
from app.kit.db import Base


class ChatLink(Base):
    __tablename__ = "chat_links"
    __table_args__ = (Index("ix_chat_links_conversation_id", "conversation_id"),)

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("conversations.id", ondelete="CASCADE")
    )
    version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
