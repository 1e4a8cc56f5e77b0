"""SQL for stored files."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.models import StoredFile


class FileRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get(self, *, tenant: str, file_id: str) -> StoredFile | None:
        """The tenant's file, or None (another tenant's id is the same as no id)."""
        result = await self.session.execute(
            select(StoredFile).where(StoredFile.id == file_id, StoredFile.tenant == tenant)
        )
        return result.scalar_one_or_none()

    def add_all(self, files: Sequence[StoredFile]) -> None:
        self.session.add_all(files)
