"""A secret the server generates once and every replica shares (the webhook signing root)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.clock import utcnow
from app.kit.db import Base


class ServerSecret(Base):
    """Random bytes under a name, written once (the first writer wins) and never changed by the
    service: replicas on one store sign with the same key without configuring it."""

    __tablename__ = "server_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
