"""SQL for API keys."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.models import ApiKey


class ApiKeyRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def tenant_for_hash(self, key_hash: str) -> str | None:
        """The tenant of a live key with this hash."""
        result = await self.session.execute(
            select(ApiKey.tenant).where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
        )
        return result.scalar_one_or_none()

    async def count_live(self) -> int:
        """How many keys are not revoked."""
        result = await self.session.execute(
            select(func.count()).select_from(ApiKey).where(ApiKey.revoked_at.is_(None))
        )
        return int(result.scalar_one())

    def add(self, key: ApiKey) -> None:
        self.session.add(key)
