"""The sweep for abandoned turns stops with its process, even when a pass loses its cancellation
(redis-py can drop one on Python 3.11: app.kit.periodic)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.conversations import background


async def test_the_sweep_runs_at_start_and_stops_though_a_pass_loses_its_cancellation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes = 0
    lost = asyncio.Event()

    async def a_pass_that_loses_its_cancellation(resources: Any) -> int:
        nonlocal passes
        passes += 1
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            lost.set()  # returns as if the call had completed, as redis-py may
        return 0

    monkeypatch.setattr(background, "recover_turns", a_pass_that_loses_its_cancellation)

    async def serve() -> None:
        async with background.recovering(None, every=0.01):  # type: ignore[arg-type]
            await asyncio.sleep(0.05)

    task = asyncio.create_task(serve())
    done, _ = await asyncio.wait({task}, timeout=10)
    if not done:  # before: the body's exit waited for the sweep for ever
        task.cancel()
    assert done, "the sweep held its process's shutdown"
    assert passes == 1  # the first pass ran at start, and was still running at the exit
    assert lost.is_set()
