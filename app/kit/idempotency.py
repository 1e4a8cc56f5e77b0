"""``Idempotency-Key`` for POSTs: the same key and body return the stored response, never a re-run.

A key is claimed (a row with no response yet) in its own transaction before the work starts, so two
concurrent requests with one key cannot both run: the second sees the claim and gets 409. The
response is written in the same transaction as the work's results, so a stored response exists if and
only if the work was committed. If the work fails, the claim is removed and the key can be retried.

A claim is a lease, like the turn lock (app/conversations/locks.py): it names its owner (a random
token per request) and expires ``lease_seconds`` after its last renewal. The request renews it every
third of that while the work runs (``kept_alive``), so a live claim never expires, and a claim whose
holder died (a SIGKILLed replica) is taken over by the next retry soon after. Taking over is a
compare-and-set on the previous owner and the expired lease, so two retries cannot both win, and
completing is a compare-and-set on our own ownership, so a holder that was only stalled (not dead) and
lost its claim cannot store its response: its transaction, and the work in it, is rolled back.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import structlog
from sqlalchemy import and_, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.kit import periodic
from app.kit.clock import utcnow
from app.kit.errors import Conflict, Unprocessable
from app.models import IdempotencyRecord

log = structlog.get_logger(__name__)

IN_PROGRESS = 0
# Claims written before leases existed (migration 0004), e.g. by an older replica during a rolling
# upgrade, have no lease and are not renewed: they count as live for this long after they were made.
LEGACY_ABANDONED_AFTER = timedelta(minutes=15)


class IdempotencyKeyReused(Unprocessable):
    code = "idempotency_key_reused"
    title = "Idempotency-Key reused with a different request"


class IdempotencyInProgress(Conflict):
    code = "idempotency_in_progress"
    title = "A request with this Idempotency-Key is still running"


class IdempotencyClaimLost(Conflict):
    code = "idempotency_claim_lost"
    title = "This request's claim on its Idempotency-Key was taken over"


def fingerprint(*, method: str, path: str, body: bytes) -> str:
    """What makes two requests "the same": method, path and the exact body bytes."""
    digest = hashlib.sha256()
    for piece in (method.encode(), b"\0", path.encode(), b"\0", body):
        digest.update(piece)
    return digest.hexdigest()


def _expired(now: datetime) -> Any:
    """SQL: the claim's lease ran out (or, for a claim without a lease, it is older than the legacy
    limit)."""
    return or_(
        IdempotencyRecord.lease_expires_at < now,
        and_(
            IdempotencyRecord.lease_expires_at.is_(None),
            IdempotencyRecord.created_at < now - LEGACY_ABANDONED_AFTER,
        ),
    )


class IdempotencyRepository:
    """SQL for idempotency records; every change of a claim is a compare-and-set on its owner."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def get(self, *, tenant: str, key: str) -> IdempotencyRecord | None:
        """The record as stored now (never a copy the session remembers from an earlier read)."""
        result = await self.session.execute(
            select(IdempotencyRecord)
            .where(IdempotencyRecord.tenant == tenant, IdempotencyRecord.key == key)
            .execution_options(populate_existing=True)
        )
        return result.scalar_one_or_none()

    async def claim(
        self, *, tenant: str, key: str, request_hash: str, owner: str, now: datetime, expires_at: datetime
    ) -> None:
        """Insert a fresh claim; ``IntegrityError`` when the key already has a record."""
        await self.session.execute(
            insert(IdempotencyRecord).values(
                tenant=tenant,
                key=key,
                request_hash=request_hash,
                status_code=IN_PROGRESS,
                response={},
                created_at=now,
                owner=owner,
                lease_expires_at=expires_at,
            )
        )

    async def take_over(
        self, *, tenant: str, key: str, previous: str | None, owner: str, now: datetime, expires_at: datetime
    ) -> bool:
        """Make ``owner`` the holder of a claim still held by ``previous`` whose lease has expired."""
        result = await self.session.execute(
            update(IdempotencyRecord)
            .where(
                IdempotencyRecord.tenant == tenant,
                IdempotencyRecord.key == key,
                IdempotencyRecord.status_code == IN_PROGRESS,
                IdempotencyRecord.owner.is_(None)
                if previous is None
                else IdempotencyRecord.owner == previous,
                _expired(now),
            )
            .values(owner=owner, lease_expires_at=expires_at)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    async def renew(self, *, tenant: str, key: str, owner: str, expires_at: datetime) -> bool:
        """Extend the lease of a claim ``owner`` still holds; False once it completed or was lost."""
        result = await self.session.execute(
            update(IdempotencyRecord)
            .where(
                IdempotencyRecord.tenant == tenant,
                IdempotencyRecord.key == key,
                IdempotencyRecord.status_code == IN_PROGRESS,
                IdempotencyRecord.owner == owner,
            )
            .values(lease_expires_at=expires_at)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    async def set_response(
        self, *, tenant: str, key: str, owner: str, status_code: int, response: dict[str, Any]
    ) -> bool:
        """Store the response on a claim ``owner`` still holds; False if it was taken over."""
        result = await self.session.execute(
            update(IdempotencyRecord)
            .where(
                IdempotencyRecord.tenant == tenant,
                IdempotencyRecord.key == key,
                IdempotencyRecord.status_code == IN_PROGRESS,
                IdempotencyRecord.owner == owner,
            )
            .values(status_code=status_code, response=response, lease_expires_at=None)
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    async def remove_claim(self, *, tenant: str, key: str, owner: str) -> None:
        """Delete a claim ``owner`` still holds (a claim taken over by another request stays)."""
        await self.session.execute(
            delete(IdempotencyRecord).where(
                IdempotencyRecord.tenant == tenant,
                IdempotencyRecord.key == key,
                IdempotencyRecord.status_code == IN_PROGRESS,
                IdempotencyRecord.owner == owner,
            )
        )


@dataclass(frozen=True, slots=True)
class StoredResponse:
    status_code: int
    body: dict[str, Any]


@dataclass(slots=True)
class Idempotency:
    """One request's use of a key: ``begin`` (replay or claim), then, with the claim ``kept_alive``
    while the work runs, ``complete`` (in the work's transaction) or ``abandon``."""

    sessionmaker: async_sessionmaker[AsyncSession]
    tenant: str
    key: str
    request_hash: str
    lease_seconds: float = 120.0
    owner: str = field(default_factory=lambda: secrets.token_hex(16))
    # Set once the response is written: renewing is pointless from then on, and a renewal that
    # finds the claim completed is not a lost claim.
    _completing: bool = field(default=False, init=False)
    _lost: bool = field(default=False, init=False)

    @property
    def _lease(self) -> timedelta:
        return timedelta(seconds=self.lease_seconds)

    async def begin(self) -> StoredResponse | None:
        """The stored response of an earlier identical request, or None once the key is claimed
        (fresh, or taken over from a holder whose lease expired)."""
        async with self.sessionmaker() as session:
            repo = IdempotencyRepository(session)
            for _ in range(3):
                now = utcnow()
                try:
                    async with session.begin():
                        await repo.claim(
                            tenant=self.tenant,
                            key=self.key,
                            request_hash=self.request_hash,
                            owner=self.owner,
                            now=now,
                            expires_at=now + self._lease,
                        )
                    return None
                except IntegrityError:
                    pass
                async with session.begin():
                    now = utcnow()
                    existing = await repo.get(tenant=self.tenant, key=self.key)
                    if existing is None:
                        continue  # the other claim was abandoned between our two statements
                    if existing.request_hash != self.request_hash:
                        raise IdempotencyKeyReused(
                            "This Idempotency-Key was used with a different request; use a new key."
                        )
                    if existing.status_code != IN_PROGRESS:
                        return StoredResponse(existing.status_code, existing.response)
                    if _live(existing, now=now):
                        raise IdempotencyInProgress(
                            "A request with this Idempotency-Key is still running; retry later."
                        )
                    if await repo.take_over(
                        tenant=self.tenant,
                        key=self.key,
                        previous=existing.owner,
                        owner=self.owner,
                        now=now,
                        expires_at=now + self._lease,
                    ):
                        log.info("idempotency_claim_taken_over", tenant=self.tenant, key=self.key)
                        return None
                    # Another retry took it over first, or its holder renewed it: look again.
            raise IdempotencyInProgress("Could not claim the Idempotency-Key; retry later.")

    async def renew(self) -> bool:
        """Extend the claim's lease; False when it completed or another request took it over."""
        async with self.sessionmaker() as session, session.begin():
            return await IdempotencyRepository(session).renew(
                tenant=self.tenant, key=self.key, owner=self.owner, expires_at=utcnow() + self._lease
            )

    @contextlib.asynccontextmanager
    async def kept_alive(self) -> AsyncIterator[None]:
        """Renew the claim every third of its lease while the body (the work) runs."""

        async def renew() -> Literal["stop"] | None:
            if self._completing:
                return "stop"
            if not await self.renew():
                if not self._completing:
                    log.warning("idempotency_claim_lost", tenant=self.tenant, key=self.key)
                return "stop"
            return None

        async with periodic.every(self.lease_seconds / 3, renew, name=f"idempotency {self.key[:40]}"):
            yield

    async def complete(self, session: AsyncSession, *, status_code: int, body: dict[str, Any]) -> None:
        """Store the response in ``session``'s transaction: it commits with the work it describes.

        Raises ``IdempotencyClaimLost`` when another request took the claim over (our lease expired
        while we were stalled), after rolling ``session`` back: the work is applied once, by the
        request whose response is stored. Rolling back here, not later in the request's teardown,
        also frees SQLite's write lock for ``abandon`` and the conversation lock's release.
        """
        self._completing = True
        stored = await IdempotencyRepository(session).set_response(
            tenant=self.tenant, key=self.key, owner=self.owner, status_code=status_code, response=body
        )
        if not stored:
            self._lost = True
            await session.rollback()
            log.warning("idempotency_claim_lost_at_completion", tenant=self.tenant, key=self.key)
            raise IdempotencyClaimLost(
                "This request's claim on its Idempotency-Key expired and was taken over by a retry; "
                "its result was discarded. Send the request again with the same key to get the "
                "stored response."
            )

    async def abandon(self) -> None:
        """Drop the claim after a failed request, so the same key can be retried."""
        if self._lost:
            return  # the claim is another request's now
        async with self.sessionmaker() as session, session.begin():
            await IdempotencyRepository(session).remove_claim(
                tenant=self.tenant, key=self.key, owner=self.owner
            )


def _live(record: IdempotencyRecord, *, now: datetime) -> bool:
    """Whether an in-progress claim's holder may still be running."""
    if record.lease_expires_at is None:
        return now - record.created_at < LEGACY_ABANDONED_AFTER
    return record.lease_expires_at >= now
