"""A sandbox process bound to one conversation: parked in a block, or live between blocks."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from app.runtime.exchange import Exchange
from app.runtime.schemas import JournalEntry, Limits
from app.runtime.worker_process import WorkerProcess


@dataclass(slots=True)
class Bound:
    """A worker whose child belongs to one conversation: parked in the middle of a block (its
    ``exchange`` waits for the answer to an external call) or live between blocks, its
    namespace equal to the snapshot ``state``."""

    worker: WorkerProcess
    limits: Limits
    blocks: int  # blocks this process has run
    exchange: Exchange | None = None
    code: str = ""
    state: bytes = b""
    memory_kb: int = 0  # live: what its resident memory grew by since its fork
    timer: asyncio.TimerHandle | None = None  # its release when it stays unused too long

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def resumed_by(self, *, code: str, limits: Limits, journal: Sequence[JournalEntry]) -> bool:
        """Whether a block is this parked block resumed: the same code and limits, and a journal
        that is its journal plus the answer to its pending call."""
        assert self.exchange is not None
        call = self.exchange.parked_call
        before = self.exchange.journal
        return (
            call is not None
            and self.code == code
            and self.limits == limits
            and len(journal) == len(before) + 1
            and all(a.name == b.name and a.digest == b.digest for a, b in zip(before, journal, strict=False))
            and journal[-1].name == call.name
            and journal[-1].digest == call.digest()
        )
