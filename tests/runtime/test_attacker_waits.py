"""Attacker pass on a block's waits for its parent: while a call is out (a slow LLM call, an
external tool the turn is parked on) the block's wall clock is paused, so a signal handler of its
code that ran then would run outside every clock, and could write a frame into the exchange while
the block waits for its reply. The block holds its signals for that wait: a handler runs once the
reply is in and the clock runs again, inside the block."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from app.runtime import CallReply, HelperCall, JournalEntry, RuntimePool
from tests.runtime.support import BACKENDS, Recorder, run, started_pool

pytestmark = pytest.mark.asyncio(loop_scope="module")

SLOW_SECONDS = 0.6

# A forked process of the block sends it SIGUSR1 0.2 s into its call. The handler notes when it
# ran and writes a file of the conversation; with ``nested``, it calls the tool itself too.
CODE = """\
import os, signal, time
marks = []
def handler(*_):
    marks.append(time.monotonic())
    with open('handled.txt', 'a') as out:
        out.write('h')
    if {nested}:
        marks.append(lookup(order_id='from the handler'))
signal.signal(signal.SIGUSR1, handler)
if os.fork() == 0:
    time.sleep(0.2)
    os.kill(os.getppid(), signal.SIGUSR1)
    os._exit(0)
asked = time.monotonic()
answer = lookup(order_id='A1')
result(answer)
result(round(marks[0] - asked, 2) if marks else None)
result(marks[1:])
"""
TOOLS = {"lookup": ["order_id"]}


class Slow(Recorder):
    """Answers every call after ``SLOW_SECONDS`` (a slow model or tool), echoing its argument."""

    async def __call__(self, call: HelperCall) -> CallReply:
        self.calls.append(call)
        await asyncio.sleep(SLOW_SECONDS)
        return CallReply(kind="value", value=f"answer to {call.arguments['order_id']}")


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=BACKENDS)
async def pool(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """Two workers, no preloads; a paused block is parked for 3 s."""
    async with started_pool(request.param, workspaces, size=2, live_seconds=3.0) as started:
        yield started


async def test_a_handler_waits_for_the_reply_of_a_slow_call(pool: RuntimePool, tmp_path: Path) -> None:
    calls = Slow()
    outcome = await run(pool, CODE.format(nested=False), workdir=tmp_path, tools=TOOLS, on_call=calls)
    assert outcome.status == "ok", outcome.error
    answer, delay, rest = outcome.results
    assert answer == "answer to A1"
    # Sent 0.2 s into the call; it ran once the reply came (0.6 s), not in the paused clock.
    assert float(delay) >= SLOW_SECONDS - 0.05, delay
    assert rest == "[]"


async def test_a_handler_cannot_call_into_its_own_wait(pool: RuntimePool, tmp_path: Path) -> None:
    """The handler's own call comes after the block's, as an ordinary call with its own reply:
    not a second frame in the middle of an exchange, nor a reply taken from the first call."""
    calls = Slow()
    outcome = await run(pool, CODE.format(nested=True), workdir=tmp_path, tools=TOOLS, on_call=calls)
    assert outcome.status == "ok", outcome.error
    assert [call.arguments["order_id"] for call in calls.calls] == ["A1", "from the handler"]
    answer, delay, rest = outcome.results
    assert answer == "answer to A1"
    assert float(delay) >= SLOW_SECONDS - 0.05, delay
    assert rest == '["answer to from the handler"]'
    assert [entry.name for entry in outcome.journal] == ["lookup", "lookup"]


async def test_nothing_of_a_parked_block_runs_until_its_resume(pool: RuntimePool, tmp_path: Path) -> None:
    """Parked on an external tool, the block's handler waits: the conversation's directory is
    as the pause left it until the resume, in which the handler runs."""
    code = CODE.format(nested=False)
    paused = await run(
        pool, code, workdir=tmp_path, tools=TOOLS, on_call=Recorder(lambda call: CallReply(kind="suspend"))
    )
    assert paused.status == "suspended", paused.error
    assert paused.pending is not None
    await asyncio.sleep(0.6)  # the signal came 0.2 s into the wait
    assert pool.parked_blocks == 1
    assert not (tmp_path / "handled.txt").exists(), "the handler ran while its block was parked"
    answer = JournalEntry.for_call(paused.pending, CallReply(kind="value", value="shipped"))
    resumed = await run(pool, code, workdir=tmp_path, tools=TOOLS, journal=[*paused.journal, answer])
    assert (resumed.status, resumed.process) == ("ok", "resumed"), resumed.error
    assert resumed.results[0] == "shipped"
    assert float(resumed.results[1]) >= 0.6
    assert (tmp_path / "handled.txt").read_text() == "h"
