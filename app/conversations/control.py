"""What one process knows of the turns it runs: their cancel signals and its detached tasks.

A cancel reaches a turn wherever it runs: directly when it runs in this process, through the bus
(Redis pub/sub) when it runs on another replica or worker, and, without Redis, through the turn's
row, which its runner polls (``cancel_requested_at``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import structlog

from app.events.bus import CANCEL_CHANNEL, EventBus
from app.kit import periodic

log = structlog.get_logger(__name__)


class TurnControl:
    """Cancel signals of this process's running turns, the tasks it runs detached, its lease id."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        # Who holds a turn's lease: unique per process start, readable in the store by an operator.
        self.owner = f"{socket.gethostname()[:30]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._cancels: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._listener: asyncio.Task[None] | None = None
        # How a stored turn is run here, and how one is handed to a job worker (set by app.wiring).
        self.run_here: Callable[[str], Coroutine[Any, Any, None]] | None = None
        self.defer: Callable[[str, str], Awaitable[None]] | None = None

    async def start(self) -> None:
        """Hear cancels sent from other processes (only a bus that crosses processes has any)."""
        if self.bus.crosses_processes:
            ready = asyncio.Event()
            self._listener = asyncio.create_task(self._listen(ready), name="sabre-turn-cancels")
            await ready.wait()

    async def _listen(self, ready: asyncio.Event) -> None:
        async with self.bus.subscribe(CANCEL_CHANNEL) as subscription:
            ready.set()
            while True:
                turn_id = await subscription.queue.get()
                event = self._cancels.get(turn_id)
                if event is not None:
                    event.set()

    @contextlib.contextmanager
    def running(self, turn_id: str) -> Iterator[asyncio.Event]:
        """Register a turn running here for as long as the block lasts; yields its cancel signal."""
        event = self._cancels.setdefault(turn_id, asyncio.Event())
        try:
            yield event
        finally:
            self._cancels.pop(turn_id, None)

    async def cancel(self, turn_id: str) -> None:
        """Signal a turn to stop, here and on every other process."""
        event = self._cancels.get(turn_id)
        if event is not None:
            event.set()
        if self.bus.crosses_processes:
            await self.bus.publish(CANCEL_CHANNEL, turn_id)

    async def dispatch(self, turn_id: str, *, tenant: str, background: bool) -> None:
        """Start a stored turn of ``tenant``: a background one on a job worker, in the tenant's
        share of the workers (here when there is no job engine), a streamed one in this process."""
        if background and self.defer is not None:
            await self.defer(turn_id, tenant)
            return
        if self.run_here is None:
            raise RuntimeError("this process cannot run stored turns")
        self.spawn(self.run_here(turn_id), name=f"turn {turn_id}")

    def spawn(self, work: Coroutine[Any, Any, None], *, name: str) -> None:
        """Run ``work`` detached from the request that started it (a client that goes away does not
        stop it); kept referenced until done, and its failure logged."""
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)

        def _done(task: asyncio.Task[Any]) -> None:
            self._tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("detached_turn_crashed", task=name, exc_info=task.exception())

        task.add_done_callback(_done)

    async def aclose(self, *, grace: float = 5.0) -> None:
        """Let detached turns finish for ``grace`` seconds, then cancel them and wait for them at
        most ``periodic.STOP_WAIT`` more: one that lost its cancellation in a Redis call would run
        to its own end. A turn left running is taken over by another process once its lease
        expires."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                _, left = await asyncio.wait(pending, timeout=periodic.STOP_WAIT)
                if left:
                    log.warning("detached_turns_not_stopped", turns=sorted(t.get_name() for t in left))
        if self._listener is not None and not await periodic.stop(self._listener):
            log.warning("turn_cancel_listener_not_stopped")
