"""SQL for API keys."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.models import ApiKey


class ApiKeyRepository:
    """All SQL on ``api_keys``."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def by_hash(self, key_hash: str) -> tuple[str, datetime | None] | None:
        """The tenant and expiry of the unrevoked key with this hash (expired or not)."""
        result = await self.session.execute(
            select(ApiKey.tenant, ApiKey.expires_at).where(
                ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None)
            )
        )
        row = result.one_or_none()
        return None if row is None else (row.tenant, row.expires_at)

    async def count_live(self) -> int:
        """How many keys are not revoked (expired ones count: a server with keys is not keyless)."""
        result = await self.session.execute(
            select(func.count()).select_from(ApiKey).where(ApiKey.revoked_at.is_(None))
        )
        return int(result.scalar_one())

    async def get(self, key_id: str) -> ApiKey | None:
        """One key by id."""
        return await self.session.get(ApiKey, key_id)

    async def list(self, *, tenant: str | None, include_revoked: bool) -> Sequence[ApiKey]:
        """Keys, oldest first, optionally of one tenant and with the revoked ones."""
        query = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
        if tenant is not None:
            query = query.where(ApiKey.tenant == tenant)
        if not include_revoked:
            query = query.where(ApiKey.revoked_at.is_(None))
        return (await self.session.execute(query)).scalars().all()

    async def revoke(self, key_id: str, *, now: datetime) -> bool:
        """Revoke a live key; False when there is none by that id (or it was already revoked)."""
        result = await self.session.execute(
            update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).values(revoked_at=now)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    def add(self, key: ApiKey) -> None:
        self.session.add(key)
