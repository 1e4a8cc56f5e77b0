"""``Idempotency-Key`` for POSTs: the same key and body return the stored response, never a re-run.

A key is claimed (a row with no response yet) in its own transaction before the work starts, so two
concurrent requests with one key cannot both run: the second sees the claim and gets 409. The
response is written in the same transaction as the work's results, so a stored response exists if and
only if the work was committed. If the work fails, the claim is removed and the key can be retried.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.kit.clock import utcnow
from app.kit.errors import Conflict, Unprocessable
from app.models import IdempotencyRecord

IN_PROGRESS = 0
# A claim older than this belongs to a process that died mid-request; it may be taken over.
ABANDONED_AFTER = timedelta(minutes=15)


class IdempotencyKeyReused(Unprocessable):
    code = "idempotency_key_reused"
    title = "Idempotency-Key reused with a different request"


class IdempotencyInProgress(Conflict):
    code = "idempotency_in_progress"
    title = "A request with this Idempotency-Key is still running"


def fingerprint(*, method: str, path: str, body: bytes) -> str:
    """What makes two requests "the same": method, path and the exact body bytes."""
    digest = hashlib.sha256()
    for piece in (method.encode(), b"\0", path.encode(), b"\0", body):
        digest.update(piece)
    return digest.hexdigest()


class IdempotencyRepository:
    """SQL for idempotency records."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get(self, *, tenant: str, key: str) -> IdempotencyRecord | None:
        result = await self.session.execute(
            select(IdempotencyRecord).where(IdempotencyRecord.tenant == tenant, IdempotencyRecord.key == key)
        )
        return result.scalar_one_or_none()

    async def set_response(
        self, *, tenant: str, key: str, status_code: int, response: dict[str, Any]
    ) -> None:
        await self.session.execute(
            update(IdempotencyRecord)
            .where(IdempotencyRecord.tenant == tenant, IdempotencyRecord.key == key)
            .values(status_code=status_code, response=response)
        )

    async def remove_claim(self, *, tenant: str, key: str) -> None:
        await self.session.execute(
            delete(IdempotencyRecord).where(
                IdempotencyRecord.tenant == tenant,
                IdempotencyRecord.key == key,
                IdempotencyRecord.status_code == IN_PROGRESS,
            )
        )


@dataclass(frozen=True, slots=True)
class StoredResponse:
    status_code: int
    body: dict[str, Any]


@dataclass(slots=True)
class Idempotency:
    """One request's use of a key: ``begin`` (replay or claim), ``complete`` or ``abandon``."""

    sessionmaker: async_sessionmaker[AsyncSession]
    tenant: str
    key: str
    request_hash: str

    async def begin(self) -> StoredResponse | None:
        """The stored response of an earlier identical request, or None once the key is claimed."""
        async with self.sessionmaker() as session:
            repo = IdempotencyRepository(session)
            for _ in range(2):
                try:
                    async with session.begin():
                        session.add(
                            IdempotencyRecord(
                                tenant=self.tenant,
                                key=self.key,
                                request_hash=self.request_hash,
                                status_code=IN_PROGRESS,
                                response={},
                                created_at=utcnow(),
                            )
                        )
                    return None
                except IntegrityError:
                    pass
                async with session.begin():
                    existing = await repo.get(tenant=self.tenant, key=self.key)
                    if existing is None:
                        continue  # the other claim was abandoned between our two statements
                    if existing.request_hash != self.request_hash:
                        raise IdempotencyKeyReused(
                            "This Idempotency-Key was used with a different request; use a new key."
                        )
                    if existing.status_code != IN_PROGRESS:
                        return StoredResponse(existing.status_code, existing.response)
                    if utcnow() - existing.created_at < ABANDONED_AFTER:
                        raise IdempotencyInProgress(
                            "A request with this Idempotency-Key is still running; retry later."
                        )
                    await repo.remove_claim(tenant=self.tenant, key=self.key)
            raise IdempotencyInProgress("Could not claim the Idempotency-Key; retry later.")

    async def complete(self, session: AsyncSession, *, status_code: int, body: dict[str, Any]) -> None:
        """Store the response in ``session``'s transaction: it commits with the work it describes."""
        await IdempotencyRepository(session).set_response(
            tenant=self.tenant, key=self.key, status_code=status_code, response=body
        )

    async def abandon(self) -> None:
        """Drop the claim after a failed request, so the same key can be retried."""
        async with self.sessionmaker() as session, session.begin():
            await IdempotencyRepository(session).remove_claim(tenant=self.tenant, key=self.key)
