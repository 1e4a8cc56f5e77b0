"""Server secrets: random bytes generated on first use and kept in the store, so that every replica
on one store holds the same key without anyone configuring it (the webhook signing root)."""

from __future__ import annotations

import secrets

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.models import ServerSecret


async def server_secret(sessionmaker: async_sessionmaker[AsyncSession], *, name: str) -> bytes:
    """The secret called ``name``, created (32 random bytes) if the store has none yet; when two
    processes create it at once, the first insert wins and both return it."""
    async with sessionmaker() as session:
        found = await _read(session, name=name)
        if found is not None:
            return found
        session.add(ServerSecret(name=name, value=secrets.token_bytes(32)))
        try:
            await session.commit()
        except IntegrityError:
            await session.rollback()
        stored = await _read(session, name=name)
        if stored is None:
            raise RuntimeError(f"server secret {name!r} was neither found nor stored")
        return stored


async def _read(session: AsyncSession, *, name: str) -> bytes | None:
    value = await session.scalar(select(ServerSecret.value).where(ServerSecret.name == name))
    return bytes(value) if value is not None else None
