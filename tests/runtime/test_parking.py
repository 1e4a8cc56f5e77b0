"""Parked blocks: a block paused on an external call keeps its process for a while, and a resume on
the same pool answers the call in that process instead of replaying the block in a new one."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from app.runtime import CallReply, JournalEntry, RuntimePool
from app.runtime.supervisor import WorkerSupervisor
from app.runtime.worker_process import WorkerState
from tests.runtime.support import BACKENDS, Recorder, bwrap_unavailable, run, started_pool

pytestmark = pytest.mark.asyncio(loop_scope="package")

# The block counts its own runs in a file: a replay runs it (and the count) again, a live resume
# does not. Python-level state proves the same: `started` is only set in the first run.
CODE = (
    "import os, time\n"
    "with open('runs.log', 'a') as log:\n"
    "    log.write('run\\n')\n"
    "started = time.monotonic()\n"
    "answer = lookup(order_id='A1')\n"
    "result(answer)\n"
    "result(open('runs.log').read().count('run'))\n"
)


@pytest_asyncio.fixture(loop_scope="package", params=BACKENDS)
async def parking(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """A two-worker pool that parks paused blocks for 2 s (no preloads: quick to start)."""
    async with started_pool(request.param, workspaces, size=2, live_seconds=2.0) as pool:
        yield pool


def suspend() -> Recorder:
    return Recorder(lambda call: CallReply(kind="suspend"))


async def pause(pool: RuntimePool, workdir: Path) -> list[JournalEntry]:
    """Run CODE until it pauses on lookup(); the journal a resume sends (with the answer)."""
    paused = await run(pool, CODE, workdir=workdir, tools={"lookup": ["order_id"]}, on_call=suspend())
    assert paused.status == "suspended", paused.error
    assert paused.pending is not None
    assert paused.pending.arguments == {"order_id": "A1"}
    answer = JournalEntry.for_call(paused.pending, CallReply(kind="value", value={"status": "shipped"}))
    return [*paused.journal, answer]


async def test_a_resume_continues_the_live_process(parking: RuntimePool, tmp_path: Path) -> None:
    journal = await pause(parking, tmp_path)
    assert parking.parked_blocks == 1
    assert parking.idle_workers == 1  # the other worker still serves new blocks
    resumed = await run(parking, CODE, workdir=tmp_path, tools={"lookup": ["order_id"]}, journal=journal)
    assert resumed.status == "ok", resumed.error
    assert resumed.process == "resumed"
    assert resumed.results == ['{"status": "shipped"}', "1"]  # the block ran once, not twice
    assert [e.name for e in resumed.journal] == ["lookup"]
    assert resumed.snapshot is not None
    assert parking.parked_blocks == 0


async def test_an_error_answer_raises_in_the_live_process(parking: RuntimePool, tmp_path: Path) -> None:
    journal = await pause(parking, tmp_path)
    failed = JournalEntry(
        name="lookup", digest=journal[-1].digest, error_type="NotFound", error_message="no order A1"
    )
    resumed = await run(
        parking, CODE, workdir=tmp_path, tools={"lookup": ["order_id"]}, journal=[*journal[:-1], failed]
    )
    assert resumed.status == "error"
    assert resumed.error is not None
    assert resumed.error.startswith("Traceback (line 5): ToolError: no order A1")


async def test_a_different_journal_replays_instead(parking: RuntimePool, tmp_path: Path) -> None:
    """The parked process only serves the exact resume of its call: another answer to another
    call (a journal that does not match) makes the block replay, and the parked one is released."""
    await pause(parking, tmp_path)
    other = JournalEntry(name="lookup", digest="0" * 64, value="x")
    replayed = await run(parking, CODE, workdir=tmp_path, tools={"lookup": ["order_id"]}, journal=[other])
    assert replayed.process == "fresh"
    assert replayed.status == "error"
    assert replayed.error is not None
    assert "ReplayDivergenceError" in replayed.error
    assert parking.parked_blocks == 0


async def test_a_parked_block_is_released_when_nobody_resumes_it(
    parking: RuntimePool, tmp_path: Path
) -> None:
    journal = await pause(parking, tmp_path)
    await asyncio.sleep(2.5)  # past live_seconds: the process stopped as suspended
    assert parking.parked_blocks == 0
    for _ in range(50):
        if parking.idle_workers == 2:
            break
        await asyncio.sleep(0.1)
    assert parking.idle_workers == 2
    replayed = await run(parking, CODE, workdir=tmp_path, tools={"lookup": ["order_id"]}, journal=journal)
    assert replayed.status == "ok", replayed.error
    assert replayed.results == ['{"status": "shipped"}', "2"]  # replayed: the block's code ran again


async def test_parking_never_takes_the_last_worker(parking: RuntimePool, workspaces: Path) -> None:
    """At most size - 1 processes stay bound: the least recently used one gives way (its block
    will replay), and a worker stays free for other conversations."""
    first, second, third = (Path(tempfile.mkdtemp(prefix="park-", dir=workspaces)) for _ in range(3))
    journal_a = await pause(parking, first)
    journal_b = await pause(parking, second)  # parks, and the older parked block gives way
    assert parking.parked_blocks == 1
    b = await run(parking, CODE, workdir=second, tools={"lookup": ["order_id"]}, journal=journal_b)
    a = await run(parking, CODE, workdir=first, tools={"lookup": ["order_id"]}, journal=journal_a)
    assert b.results[-1] == "1", b.error  # live
    assert a.results[-1] == "2", a.error  # replayed
    assert parking.parked_blocks == 0
    assert parking.live_processes == 1  # first's, which ran last
    done = await run(parking, "result(1)", workdir=third)  # a free worker serves another one
    assert done.results == ["1"]


async def test_worker_states_follow_a_parked_block_and_its_eviction(workspaces: Path, tmp_path: Path) -> None:
    """Each worker's state says where it is: bound to the parked block's conversation, running,
    idle; a block that finds no idle worker makes the parked one give its worker back and wakes
    when that worker has its next child (no polling)."""
    pool = RuntimePool(size=2, preload=(), sandbox="process", workspaces=workspaces, live_seconds=30.0)
    await pool.start()
    try:
        await pause(pool, tmp_path)
        assert sorted(w.state for w in pool.workers.workers) == sorted([WorkerState.BOUND, WorkerState.IDLE])
        other = Path(tempfile.mkdtemp(prefix="busy-", dir=workspaces))
        busy = asyncio.ensure_future(run(pool, "import time\ntime.sleep(30)\n", workdir=other))
        both = sorted([WorkerState.BOUND, WorkerState.RUNNING])
        while sorted(w.state for w in pool.workers.workers) != both:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        third = Path(tempfile.mkdtemp(prefix="third-", dir=workspaces))
        done = await run(pool, "result(3)", workdir=third)
        assert done.results == ["3"]
        assert pool.parked_blocks == 0
        busy.cancel()
    finally:
        await pool.aclose()


async def test_a_block_waiting_for_a_worker_fails_when_the_pool_closes(
    workspaces: Path, tmp_path: Path
) -> None:
    pool = RuntimePool(size=1, preload=(), sandbox="process", workspaces=workspaces)
    await pool.start()
    other = Path(tempfile.mkdtemp(prefix="busy-", dir=workspaces))
    busy = asyncio.ensure_future(run(pool, "import time\ntime.sleep(30)\n", workdir=other))
    while [w.state for w in pool.workers.workers] != [WorkerState.RUNNING]:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    waiting = asyncio.ensure_future(run(pool, "result(1)", workdir=tmp_path))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # the only worker is busy: it waits
    await pool.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await waiting
    assert (await busy).status == "error"  # its worker was killed with the pool


async def test_a_waiting_block_cancelled_leaves_the_others_waiting(workspaces: Path, tmp_path: Path) -> None:
    """Blocks waiting for a worker share one wake-up: a request that goes away (its block is
    cancelled while it waits) must not cancel the others' wait."""
    pool = RuntimePool(size=1, preload=(), sandbox="process", workspaces=workspaces)
    await pool.start()
    try:
        other = Path(tempfile.mkdtemp(prefix="busy-", dir=workspaces))
        busy = asyncio.ensure_future(run(pool, "import time\ntime.sleep(1)\nresult('busy')\n", workdir=other))
        while [w.state for w in pool.workers.workers] != [WorkerState.RUNNING]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        gone = asyncio.ensure_future(run(pool, "result('gone')", workdir=tmp_path))
        kept = asyncio.ensure_future(run(pool, "result('kept')", workdir=tmp_path))
        await asyncio.sleep(0.1)
        gone.cancel()
        assert (await busy).results == ["busy"]
        assert (await kept).results == ["kept"]
        assert gone.cancelled()
    finally:
        await pool.aclose()


@pytest_asyncio.fixture(loop_scope="package", params=BACKENDS)
async def roomy(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """One free worker, and room for two processes bound to conversations beside it."""
    async with started_pool(
        request.param, workspaces, size=1, live_seconds=30.0, live_processes=2, surplus_idle_seconds=0.3
    ) as pool:
        yield pool


async def _until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    for _ in range(int(seconds * 100)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the pool did not get there in time")


async def test_bound_processes_get_workers_of_their_own(roomy: RuntimePool, workspaces: Path) -> None:
    """live_processes: two paused blocks keep their processes, each on a worker forked for it,
    while the free worker goes on serving new blocks; both resume where they stopped."""
    first, second, third = (Path(tempfile.mkdtemp(prefix="room-", dir=workspaces)) for _ in range(3))
    journal_a = await pause(roomy, first)
    journal_b = await pause(roomy, second)
    assert roomy.parked_blocks == 2, [(w.state, w.pid) for w in roomy.workers.workers]
    await _until(lambda: roomy.idle_workers == 1)
    assert len(roomy.workers.workers) == 3
    done = await run(roomy, "result(3)", workdir=third)  # the free one: nobody gives way
    assert done.results == ["3"]
    assert roomy.parked_blocks == 2
    a = await run(roomy, CODE, workdir=first, tools={"lookup": ["order_id"]}, journal=journal_a)
    b = await run(roomy, CODE, workdir=second, tools={"lookup": ["order_id"]}, journal=journal_b)
    assert (a.process, a.results[-1]) == ("resumed", "1"), a.error
    assert (b.process, b.results[-1]) == ("resumed", "1"), b.error


async def test_past_live_processes_the_least_recently_used_gives_way(
    roomy: RuntimePool, workspaces: Path
) -> None:
    first, second, third = (Path(tempfile.mkdtemp(prefix="room-", dir=workspaces)) for _ in range(3))
    journal_a = await pause(roomy, first)
    await pause(roomy, second)
    await pause(roomy, third)  # a third: the first gives way (its block will replay)
    assert roomy.parked_blocks == 2
    await _until(lambda: len(roomy.workers.workers) <= 3 and roomy.idle_workers >= 1)
    assert len(roomy.workers.workers) <= 3  # never more than size + live_processes
    a = await run(roomy, CODE, workdir=first, tools={"lookup": ["order_id"]}, journal=journal_a)
    assert (a.process, a.results[-1]) == ("fresh", "2"), a.error


async def test_surplus_workers_go_once_their_conversations_let_go(
    roomy: RuntimePool, workspaces: Path
) -> None:
    """When the bound processes are released, the pool is back to ``size`` workers after
    ``surplus_idle_seconds``: the extra ones were only for them."""
    paths = [Path(tempfile.mkdtemp(prefix="room-", dir=workspaces)) for _ in range(2)]
    for path in paths:
        await pause(roomy, path)
    await _until(lambda: len(roomy.workers.workers) == 3 and roomy.idle_workers == 1)
    while roomy.bindings.give_way():  # as their live time running out would
        pass
    await _until(lambda: len(roomy.workers.workers) == 1 and roomy.idle_workers == 1)
    done = await run(roomy, "result(1)", workdir=paths[0])
    assert done.results == ["1"]


async def test_a_worker_that_cannot_be_added_does_not_strand_a_waiting_block(workspaces: Path) -> None:
    """The one worker holds a paused block and the worker forked to replace it fails to start
    (the kernel refused the fork, say): a block that waited for it is not left waiting until the
    paused one's live time runs out; the paused one gives way."""
    async with RuntimePool(
        size=1, preload=(), sandbox="process", workspaces=workspaces, live_seconds=60.0, live_processes=1
    ) as pool:

        async def refused() -> None:
            await asyncio.sleep(0.3)
            raise RuntimeError("the sandbox zygote could not fork a worker")

        pool.workers._spawn = refused  # type: ignore[method-assign,assignment]
        first, second = (Path(tempfile.mkdtemp(prefix="room-", dir=workspaces)) for _ in range(2))
        await pause(pool, first)
        assert pool.parked_blocks == 1
        async with asyncio.timeout(10):
            done = await run(pool, "result(2)", workdir=second)
        assert done.results == ["2"]
        assert pool.parked_blocks == 0


async def test_without_cheap_workers_bound_processes_take_turns_on_the_workers(
    workspaces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where workers of one zygote cannot share its PID namespace (an unprivileged server under
    bwrap, where bubblewrap refuses the zygote its /proc), a worker is a bubblewrap and an
    interpreter of its own: the pool forks none for bound processes, which take turns on
    ``size - 1`` of its workers as before."""
    if (why := await bwrap_unavailable(workspaces)) is not None:
        pytest.skip(f"bubblewrap cannot run here: {why}")
    monkeypatch.setattr(WorkerSupervisor, "_shares_namespace", staticmethod(lambda: False))
    async with RuntimePool(
        size=2, preload=(), sandbox="bwrap", workspaces=workspaces, live_seconds=30.0, live_processes=4
    ) as pool:
        assert len(pool.workers.zygotes) == 2  # a zygote, and a namespace, per worker
        first, second = (Path(tempfile.mkdtemp(prefix="room-", dir=workspaces)) for _ in range(2))
        await pause(pool, first)
        await pause(pool, second)  # the first gives way: one worker stays free
        assert pool.parked_blocks == 1
        await asyncio.sleep(0.3)
        assert len(pool.workers.workers) == 2
