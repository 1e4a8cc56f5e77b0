"""API keys: creation (shown once, stored hashed) and resolution of a bearer token to a tenant."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.repository import ApiKeyRepository
from app.kit.ids import new_id
from app.models import ApiKey

LOCAL_TENANT = "local"
KEY_PREFIX = "sk-sabre-"


def hash_key(secret: str) -> str:
    """SHA-256 of the key: keys are long random strings, so a fast hash is enough."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class CreatedKey:
    id: str
    tenant: str
    secret: str


async def create_key(session: AsyncSession, *, tenant: str) -> CreatedKey:
    """Make a new key for ``tenant``; the secret is returned once and only its hash is kept."""
    if not tenant or len(tenant) > 128 or not tenant.replace("-", "").replace("_", "").isalnum():
        raise ValueError("tenant must be 1-128 characters of letters, digits, '-' and '_'")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(id=new_id("key"), tenant=tenant, key_hash=hash_key(secret), prefix=secret[:12])
    ApiKeyRepository(session).add(key)
    await session.flush()
    return CreatedKey(id=key.id, tenant=tenant, secret=secret)


class Authenticator:
    """Resolves bearer tokens: static keys from the configuration first, then stored keys."""

    def __init__(self, *, static_keys: dict[str, str], open_mode: bool) -> None:
        self._static = {hash_key(k): tenant for k, tenant in static_keys.items()}
        self.open_mode = open_mode

    async def tenant_for(self, session: AsyncSession, token: str) -> str | None:
        """The tenant owning ``token``, or None."""
        digest = hash_key(token)
        for known, tenant in self._static.items():
            if hmac.compare_digest(known, digest):
                return tenant
        return await ApiKeyRepository(session).tenant_for_hash(digest)
