"""Sandbox processes bound to one conversation each: parked in a block, or live between blocks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.runtime.exchange import Exchange
from app.runtime.schemas import JournalEntry, Limits
from app.runtime.tiers import Tier
from app.runtime.worker_process import WorkerProcess


@dataclass(slots=True)
class Bound:
    """A worker whose child belongs to one conversation: parked in the middle of a block (its
    ``exchange`` waits for the answer to an external call) or live between blocks, its
    namespace equal to the snapshot ``state``."""

    worker: WorkerProcess
    limits: Limits
    blocks: int  # blocks this process has run
    tier: Tier = "preloaded"  # the workers its worker is one of
    exchange: Exchange | None = None
    code: str = ""
    state: bytes = b""
    memory_kb: int = 0  # live: what its resident memory grew by since its fork
    # Readied for the conversation's next block before its code was known (``RuntimePool.prepare``):
    # it ran no block yet, and ``dropped`` are the names its snapshot could not restore.
    prepared: bool = False
    dropped: tuple[str, ...] = ()
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


class Bindings:
    """The processes bound to conversations (parked or live), by working directory (one per
    conversation), least recently used first, each released ``seconds`` after it was bound. Live
    ones share a memory budget (``memory_kb``: what they grew by since their fork). ``let_go``
    releases a process the pool no longer keeps (its worker rearms in the background)."""

    def __init__(self, *, seconds: float, memory_kb: int, let_go: Callable[[Bound], None]) -> None:
        self.seconds = seconds
        self._memory_kb = memory_kb
        self._let_go = let_go
        self._bound: dict[Path, Bound] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._bound)

    @property
    def parked(self) -> int:
        """Paused blocks whose process waits for a resume here."""
        return sum(1 for bound in self._bound.values() if bound.exchange is not None)

    @property
    def live(self) -> int:
        """Processes bound to a conversation between its blocks."""
        return sum(1 for bound in self._bound.values() if bound.exchange is None)

    def holds(self, workdir: Path) -> bool:
        """Whether a process is bound to ``workdir``'s conversation."""
        return workdir in self._bound

    def take(self, workdir: Path) -> Bound | None:
        """The process bound to ``workdir``'s conversation, no longer bound (None: none)."""
        bound = self._bound.pop(workdir, None)
        if bound is not None:
            bound.cancel_timer()
        return bound

    def keep(self, workdir: Path, bound: Bound, *, capacity: int) -> bool:
        """Keep ``bound`` for ``workdir``'s next block, at most ``capacity`` processes of its tier:
        the least recently used of them gives way (a live one before any parked block; a live
        process is not kept when every bound one holds a paused block). False when ``bound``
        itself is let go."""
        earlier = self.take(workdir)
        if earlier is not None:  # the conversation ran a block elsewhere in between
            self._let_go(earlier)
        if self._closed or (bound.exchange is None and bound.memory_kb > self._memory_kb):
            self._let_go(bound)  # it alone holds more than all live processes may
            return False
        while len(peers := [b for b in self._bound.values() if b.tier == bound.tier]) >= capacity:
            if bound.exchange is None and all(b.exchange is not None for b in peers):
                self._let_go(bound)  # a live process gives way to paused blocks, not they to it
                return False
            self.give_way(bound.tier)
        bound.timer = asyncio.get_running_loop().call_later(self.seconds, self._expire, workdir, bound)
        self._bound[workdir] = bound
        while sum(b.memory_kb for b in self._bound.values()) > self._memory_kb:
            self.give_way()  # live ones only hold memory: the least recently used goes first
        return True

    def give_way(self, tier: Tier | None = None) -> bool:
        """Release one bound process (of ``tier``; None: of either): the least recently used live
        one, or when every one holds a paused block (whose resume is due, and would replay), the
        least recently used of those. False when none is bound."""
        candidates = [w for w, b in self._bound.items() if tier is None or b.tier == tier]
        if not candidates:
            return False
        workdir = next((w for w in candidates if self._bound[w].exchange is None), candidates[0])
        oldest = self._bound.pop(workdir)
        oldest.cancel_timer()
        self._let_go(oldest)
        return True

    def _expire(self, workdir: Path, bound: Bound) -> None:
        """``seconds`` after it was bound: the process stops (a timer, not a task: a task per
        block costs its start and its cancellation on every next block)."""
        if self._bound.get(workdir) is bound and not self._closed:
            del self._bound[workdir]
            self._let_go(bound)

    def close(self) -> None:
        """Forget every bound process (the pool kills their workers with the rest)."""
        self._closed = True
        for bound in self._bound.values():
            bound.cancel_timer()
        self._bound.clear()
