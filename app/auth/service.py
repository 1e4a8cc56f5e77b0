"""API keys: creation (shown once, stored hashed), listing, revocation, rotation, and resolution
of a bearer token to a tenant."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.repository import ApiKeyRepository
from app.kit.clock import utcnow
from app.kit.errors import Unauthorized
from app.kit.ids import new_id
from app.models import ApiKey

LOCAL_TENANT = "local"
KEY_PREFIX = "sk-sabre-"
NAME_MAX = 64


class KeyExpired(Unauthorized):
    """A stored key past its ``expires_at`` (told apart from an unknown key: its holder had it)."""

    code = "key_expired"
    title = "The API key has expired"


def hash_key(secret: str) -> str:
    """SHA-256 of the key: keys are long random strings, so a fast hash is enough."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class CreatedKey:
    """A key just made: the only time its secret exists outside the caller's hands."""

    id: str
    tenant: str
    secret: str
    name: str | None = None
    expires_at: datetime | None = None


def _check_tenant(tenant: str) -> None:
    if not tenant or len(tenant) > 128 or not tenant.replace("-", "").replace("_", "").isalnum():
        raise ValueError("tenant must be 1-128 characters of letters, digits, '-' and '_'")


def _check_name(name: str | None) -> None:
    if name is not None and (not name.strip() or len(name) > NAME_MAX or not name.isprintable()):
        raise ValueError(f"name must be 1-{NAME_MAX} printable characters")


async def create_key(
    session: AsyncSession, *, tenant: str, name: str | None = None, expires_at: datetime | None = None
) -> CreatedKey:
    """Make a new key for ``tenant``; the secret is returned once and only its hash is kept."""
    _check_tenant(tenant)
    _check_name(name)
    if expires_at is not None and expires_at <= utcnow():
        raise ValueError("the expiry must be in the future")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=new_id("key"),
        tenant=tenant,
        key_hash=hash_key(secret),
        prefix=secret[:12],
        name=name,
        expires_at=expires_at,
    )
    ApiKeyRepository(session).add(key)
    await session.flush()
    return CreatedKey(id=key.id, tenant=tenant, secret=secret, name=name, expires_at=expires_at)


async def list_keys(
    session: AsyncSession, *, tenant: str | None = None, include_revoked: bool = False
) -> Sequence[ApiKey]:
    """The stored keys (never their secrets), oldest first."""
    return await ApiKeyRepository(session).list(tenant=tenant, include_revoked=include_revoked)


async def revoke_key(session: AsyncSession, key_id: str) -> bool:
    """Revoke a key at once; False when no live key has that id."""
    return await ApiKeyRepository(session).revoke(key_id, now=utcnow())


async def rotate_key(session: AsyncSession, key_id: str, *, grace: timedelta | None = None) -> CreatedKey:
    """A new key for the same tenant, name and expiry; the old one is revoked now, or with
    ``grace`` keeps working that long (so clients can switch). ``LookupError``: no such live key,
    or it has expired."""
    repo = ApiKeyRepository(session)
    old = await repo.get(key_id)
    now = utcnow()
    if old is None or old.revoked_at is not None:
        raise LookupError(f"no live key {key_id!r}")
    if old.expires_at is not None and old.expires_at <= now:
        # Its successor would inherit a past expiry: a new key is a decision, not a rotation.
        raise LookupError(f"key {key_id!r} has expired; create a new one with `sabre keys create`")
    created = await create_key(session, tenant=old.tenant, name=old.name, expires_at=old.expires_at)
    if grace is None or grace <= timedelta(0):
        await repo.revoke(key_id, now=now)
    else:
        until = now + grace
        old.expires_at = until if old.expires_at is None else min(old.expires_at, until)
        await session.flush()
    return created


def key_status(key: ApiKey, *, now: datetime) -> str:
    """``live``, ``expired`` or ``revoked``."""
    if key.revoked_at is not None:
        return "revoked"
    if key.expires_at is not None and key.expires_at <= now:
        return "expired"
    return "live"


class Authenticator:
    """Resolves bearer tokens: static keys from the configuration first, then stored keys."""

    def __init__(self, *, static_keys: dict[str, str], open_mode: bool) -> None:
        self._static = {hash_key(k): tenant for k, tenant in static_keys.items()}
        self.open_mode = open_mode

    def static_tenant(self, token: str) -> str | None:
        """The tenant of ``token`` when it is one of the configured keys (no store read), else None."""
        digest = hash_key(token)
        for known, tenant in self._static.items():
            if hmac.compare_digest(known, digest):
                return tenant
        return None

    async def tenant_for(self, session: AsyncSession, token: str) -> str | None:
        """The tenant owning ``token``, or None; ``KeyExpired`` for a stored key past its expiry."""
        if (tenant := self.static_tenant(token)) is not None:
            return tenant
        found = await ApiKeyRepository(session).by_hash(hash_key(token))
        if found is None:
            return None
        tenant, expires_at = found
        if expires_at is not None and expires_at <= utcnow():
            raise KeyExpired("The API key has expired; ask the operator for a new one.")
        return tenant
