"""Stored responses of POSTs made with an ``Idempotency-Key``, per tenant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.clock import utcnow
from app.kit.db import Base


class IdempotencyRecord(Base):
    __tablename__ = "idempotency_records"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int] = mapped_column(Integer)
    response: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The claim is a lease: the request holding it (a random token) renews ``lease_expires_at`` while
    # it runs, so a claim whose holder died is taken over soon after. Only the owner may complete it.
    # Both are None on claims written before migration 0004 (see ``LEGACY_ABANDONED_AFTER``).
    owner: Mapped[str | None] = mapped_column(String(64), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
