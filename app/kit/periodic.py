"""Work repeated in the background for as long as a block of code runs (lease renewals, polls).

One definition of how such a task stops, because stopping is where it goes wrong: a database or
Redis driver can turn the CancelledError that lands inside its call into an ordinary error, so a
loop that relies on cancellation alone goes on for ever and a ``finally`` that awaits it hangs the
request. Here the loop also checks a flag, the body's exit waits for it at most ``STOP_WAIT``, and a
failing step is logged and retried at the next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, Literal

import structlog

log = structlog.get_logger(__name__)

STOP_WAIT: Final = 2.0

Step = Callable[[], Awaitable[Literal["stop"] | None]]


@contextlib.asynccontextmanager
async def every(interval: float, step: Step, *, name: str) -> AsyncIterator[None]:
    """Run ``step`` every ``interval`` seconds while the body runs (first after one interval);
    ``step`` returns ``"stop"`` to end the repetition early."""
    stop = asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            await asyncio.sleep(interval)
            if stop.is_set():
                return
            try:
                if await step() == "stop":
                    return
            except Exception:  # a blip in the store or Redis must not end what it keeps alive
                log.warning("periodic_step_failed", task=name, exc_info=True)

    task = asyncio.create_task(loop(), name=name)
    try:
        yield
    finally:
        stop.set()
        task.cancel()
        # Never wait long: the body's work is done, and the loop ends at its next check anyway.
        await asyncio.wait({task}, timeout=STOP_WAIT)
