"""The chat links: which conversation a Chat Completions history continues (all SQL of this domain)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import literal, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.kit.clock import utcnow
from app.models import ChatLink, Conversation


@dataclass(slots=True)
class ChatLinkRepository:
    session: AsyncSession

    async def conversation(self, *, tenant: str, digest: str) -> Conversation | None:
        """The tenant's conversation a history digest is linked to, if it is still at the version the
        linked answer left it at (one statement: this is on every chat request's path)."""
        query = (
            select(Conversation)
            .join(ChatLink, ChatLink.conversation_id == Conversation.id)
            .where(
                ChatLink.tenant == tenant,
                ChatLink.digest == digest,
                Conversation.tenant == tenant,
                Conversation.version == ChatLink.version,
            )
        )
        return (await self.session.execute(query)).scalar_one_or_none()

    async def put(self, *, tenant: str, digest: str, conversation_id: str, version: int) -> None:
        """Link a history digest to the conversation and the version its answer left it at (the
        newest answer wins: the same history answered twice is continued where it was last).

        Only a conversation of the tenant that still exists is linked: a replayed answer (or a
        stream's end) may come after the conversation was deleted, whose link the foreign key
        would refuse (a 500); then nothing is linked and the history starts anew."""
        now = utcnow()
        dialect = self.session.get_bind().dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        existing = select(
            literal(tenant),
            literal(digest),
            Conversation.id,
            literal(version),
            literal(now, type_=ChatLink.__table__.c.created_at.type),
        ).where(Conversation.id == conversation_id, Conversation.tenant == tenant)
        statement = insert(ChatLink).from_select(
            ["tenant", "digest", "conversation_id", "version", "created_at"], existing
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[ChatLink.tenant, ChatLink.digest],
                set_={"conversation_id": conversation_id, "version": version, "created_at": now},
            )
        )
