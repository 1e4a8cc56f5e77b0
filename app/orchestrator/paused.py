"""A paused block, as stored between the pause and the resume: versioned, and strict on load.

It holds what the resume needs to run the block again from the namespace snapshot taken before it:
the code, the replay journal of the calls it made, and the external calls waiting for the caller.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.runtime import CallReply, HelperCall, JournalEntry


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
