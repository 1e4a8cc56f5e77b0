"""Work repeated in the background for as long as a block of code runs (lease renewals, polls).

One definition of how such a task stops, because stopping is where it goes wrong: a database or
Redis driver can turn the CancelledError that lands inside its call into an ordinary error, or lose
it outright (redis-py sends every command under ``asyncio.wait_for``, which on Python 3.11 returns
the result, dropping the cancellation, when it lands as the send completes: a tight loop of Redis
calls cancelled at random loses one in a few tries). So a loop that relies on cancellation alone
goes on for ever and a ``finally`` that awaits it hangs the request or the process's shutdown. Here
the loop also checks a flag, the body's exit waits for it at most ``STOP_WAIT``, and a failing step
is logged and retried at the next tick; :func:`stop` is the bounded wait for any other task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, Literal

import structlog

log = structlog.get_logger(__name__)

STOP_WAIT: Final = 2.0

Step = Callable[[], Awaitable[Literal["stop"] | None]]


@contextlib.asynccontextmanager
async def every(interval: float, step: Step, *, name: str, immediately: bool = False) -> AsyncIterator[None]:
    """Run ``step`` every ``interval`` seconds while the body runs (first after one interval, or at
    once with ``immediately``); ``step`` returns ``"stop"`` to end the repetition early."""
    stopping = asyncio.Event()

    async def loop() -> None:
        first = immediately
        while not stopping.is_set():
            if not first:
                await asyncio.sleep(interval)
            first = False
            if stopping.is_set():
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
        stopping.set()
        # Never wait long: the body's work is done, and the loop ends at its next check anyway.
        await stop(task)


async def stop(task: asyncio.Task[Any], *, within: float = STOP_WAIT) -> bool:
    """Cancel ``task`` and wait for it to end, at most ``within`` seconds; whether it ended. How it
    ended is not raised (its failure was its own to log)."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=within)
    if done and not task.cancelled():
        task.exception()
    return bool(done)
