"""Rows for tests that use the store directly (repositories, locks), without the service."""

from __future__ import annotations

from app.kit.clock import utcnow
from app.kit.ids import new_id
from app.models import Conversation


def conversation_row(tenant: str = "t", *, version: int = 0) -> Conversation:
    """A new, idle conversation of ``tenant`` with nothing in it, not yet added to a session."""
    now = utcnow()
    return Conversation(
        id=new_id("conv"),
        tenant=tenant,
        persona="default",
        max_iterations=5,
        tools=[],
        status="idle",
        version=version,
        next_seq=0,
        input_tokens=0,
        output_tokens=0,
        llm_calls=0,
        iterations=0,
        created_at=now,
        updated_at=now,
    )
