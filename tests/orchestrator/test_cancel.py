"""A turn's task cancelled from outside (its job worker shutting down, its request gone) while it
waits on the model: the model call ends with it, and the cancellation is not turned into the
turn's own ``cancelled`` outcome (which only the turn's cancel signal means)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from app.llm.base import LLMResponse
from app.orchestrator.loop import TurnInput, TurnLoop
from app.orchestrator.messages import TextPart, TranscriptMessage
from app.runtime import Limits


class _HangingModel:
    """A model that never answers; says when its call started and when it was cancelled, and
    takes until ``closed`` is set to end once cancelled (an HTTP stream being closed)."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.closed = asyncio.Event()

    async def complete(
        self, *, model: str, instructions: str, messages: Sequence[Any], **_: Any
    ) -> LLMResponse:
        self.called.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.ended.set_result("cancelled")
            await self.closed.wait()
            raise
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        return None


def _turn(tmp_path: Path, cancel: asyncio.Event) -> TurnInput:
    return TurnInput(
        conversation_id="conv_test",
        turn_id="turn_test",
        tenant="local",
        system_prompt="",
        model="m",
        history=(),
        new_messages=[TranscriptMessage(role="user", parts=[TextPart(text="hi")])],
        snapshot=None,
        max_iterations=3,
        workdir=tmp_path,
        limits=Limits(),
        cancel=cancel,
    )


async def _started(tmp_path: Path) -> tuple[asyncio.Task[Any], _HangingModel, asyncio.Event]:
    model = _HangingModel()
    loop = TurnLoop(llm=model, pool=None, max_output_chars=1000)  # type: ignore[arg-type]
    cancel = asyncio.Event()
    task = asyncio.create_task(loop.run(_turn(tmp_path, cancel)))
    await asyncio.wait_for(model.called.wait(), 5)
    return task, model, cancel


async def test_a_turn_cancelled_from_outside_ends_its_model_call(tmp_path: Path) -> None:
    task, model, _ = await _started(tmp_path)
    model.closed.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    # Before: the model call went on, detached, after the turn's task had ended.
    assert await asyncio.wait_for(model.ended, 2) == "cancelled"


async def test_an_outside_cancel_during_the_turns_own_cancel_is_not_swallowed(tmp_path: Path) -> None:
    """The turn's cancel signal fires, and while the turn waits for its model call to end, its task
    is cancelled too (a worker shutting down): the task ends cancelled, not with a ``cancelled``
    outcome the service would store as if a user had asked for it."""
    task, model, cancel = await _started(tmp_path)
    cancel.set()
    await asyncio.wait_for(model.ended, 5)  # the loop saw the signal and cancelled the model call
    task.cancel()  # while it waits for the call to end, the task is cancelled
    model.closed.set()
    # Before: the task's cancellation was suppressed with the model call's, and the turn ended
    # with a ``cancelled`` outcome.
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
