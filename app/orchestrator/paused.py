"""A paused block, as stored between the pause and the resume: versioned, and strict on load.

It holds what the resume needs to run the block again from the namespace snapshot taken before it:
the code, the replay journal of the calls it made, and the external calls waiting for the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.runtime import CallReply, HelperCall, JournalEntry
from app.runtime.protocol import MAX_JOURNAL_BYTES, journal_bytes
from app.runtime.schemas import journal_full


class PendingCall(BaseModel):
    """An external tool call waiting for the caller's result."""

    model_config = ConfigDict(extra="forbid")

    id: str
    call: HelperCall
    expires_at: datetime

    def answered(self, reply: CallReply) -> JournalEntry:
        """The journal entry that makes the replayed block get ``reply`` from this call."""
        return JournalEntry.for_call(self.call, reply)


class PausedBlock(BaseModel):
    """Version 1 of the pause record; a record of another version is refused, never guessed at."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    code: str
    journal: list[JournalEntry] = Field(default_factory=list)
    pending: list[PendingCall]
    note: str | None = None

    def answered(self, replies: Mapping[str, CallReply]) -> tuple[list[JournalEntry], dict[str, CallReply]]:
        """The journal a resume replays: this one, then the reply to each pending call (``replies``,
        by call id) in order; and the replies as journaled. A reply that would take the journal past
        ``MAX_JOURNAL_BYTES`` is journaled as ``journal_full``'s ToolError instead, as the runtime
        does for the answers within one run: the caller's results, however many resumes bring
        them, never grow what every later resume stores, loads and replays beyond that."""
        journal = list(self.journal)
        used = journal_bytes([entry.to_wire() for entry in journal])
        journaled: dict[str, CallReply] = {}
        for pending in self.pending:
            reply = replies[pending.id]
            entry = pending.answered(reply)
            size = journal_bytes([entry.to_wire()])
            if used + size > MAX_JOURNAL_BYTES:
                reply = journal_full(pending.call.name)
                entry = pending.answered(reply)
                size = journal_bytes([entry.to_wire()])
            used += size
            journal.append(entry)
            journaled[pending.id] = reply
        return journal, journaled

    def to_store(self) -> dict[str, Any]:
        """JSON for the conversation row."""
        return self.model_dump(mode="json")

    @classmethod
    def from_store(cls, raw: dict[str, Any]) -> PausedBlock:
        """Load a stored record (raises ``pydantic.ValidationError`` on an unknown version)."""
        return cls.model_validate(raw)


class ResumeBlock(BaseModel):
    """A block to run (again) before the model is asked anything: the paused one, with answers."""

    code: str
    journal: list[JournalEntry] = Field(default_factory=list)
    note: str | None = None
