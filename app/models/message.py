"""One transcript message; its parts are a JSON list discriminated on ``kind``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.clock import utcnow
from app.kit.db import Base

# ``seq`` is a 32-bit INTEGER column: a query bound past this is refused (422), never sent to the store.
SEQ_MAX = 2**31 - 1


class Message(Base):
    __tablename__ = "messages"
    __table_args__ = (UniqueConstraint("conversation_id", "seq"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("conversations.id", ondelete="CASCADE")
    )
    seq: Mapped[int] = mapped_column(Integer)
    turn_id: Mapped[str] = mapped_column(String(40))
    role: Mapped[str] = mapped_column(String(16))
    parts: Mapped[list[Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
