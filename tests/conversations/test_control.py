"""A process's detached turns at shutdown: cancelled after the grace period, and not waited for
past a bound when one loses its cancellation (redis-py can drop one on Python 3.11:
app.kit.periodic)."""

from __future__ import annotations

import asyncio
import time

from app.conversations.control import TurnControl
from app.events.bus import LocalBus


async def test_a_detached_turn_that_loses_its_cancellation_does_not_hold_the_shutdown() -> None:
    control = TurnControl(LocalBus())
    cancelled = asyncio.Event()
    finished = asyncio.Event()

    async def turn() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()  # lost: the turn goes on to its own end
        await asyncio.sleep(60)
        finished.set()

    control.spawn(turn(), name="turn test")
    started = time.monotonic()
    closing = asyncio.create_task(control.aclose(grace=0.1))
    done, _ = await asyncio.wait({closing}, timeout=15)
    for task in asyncio.all_tasks():
        if task.get_name() == "turn test":
            task.cancel()  # the leftover of this test, whichever way it went
    assert done, "the shutdown waited for the turn to end (60 s)"
    assert cancelled.is_set()
    assert not finished.is_set()
    assert time.monotonic() - started < 5
