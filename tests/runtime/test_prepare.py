"""Readying a conversation's process ahead of its block (``RuntimePool.prepare``): while the
model writes the code, a fresh child enters the conversation's directory and restores its
snapshot; the block then starts in it like a live process's next block. It must be the same as a
fresh block from that snapshot, never serve another conversation, and give way to a fresh fork
whenever the block is not the one it was readied for."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from app.runtime import CallReply, JournalEntry, Limits, RuntimePool
from tests.runtime.support import BACKENDS, Recorder, conversation, run, started_pool

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The process's own mark (pids repeat across bwrap's PID namespaces): set by the first block a
# process runs, kept by a live one.
MARK = (
    "import os, sys\n"
    "sys.sabre_mark = getattr(sys, 'sabre_mark', None) or os.urandom(8).hex()\n"
    "result(sys.sabre_mark)\n"
)


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=BACKENDS)
async def pool(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """Three workers (two processes may stay bound), no preloads: quick to start."""
    async with started_pool(request.param, workspaces, size=3, live_seconds=30.0) as started:
        yield started


def prepare(
    pool: RuntimePool, workdir: Path, snapshot: bytes | None, *, tools: dict[str, list[str]] | None = None
) -> bool:
    """``pool.prepare`` with the names ``run`` gives its blocks."""
    return pool.prepare(
        snapshot=snapshot, workdir=workdir, limits=Limits(), internal_helpers=(), external_tools=tools or {}
    )


async def ready(
    pool: RuntimePool, workdir: Path, snapshot: bytes | None, *, tools: dict[str, list[str]] | None = None
) -> None:
    """``prepare``, then wait until the process is bound (the service does not wait: the block's
    ``run_block`` does, if it comes first)."""
    assert prepare(pool, workdir, snapshot, tools=tools)
    resolved = await asyncio.to_thread(workdir.resolve)
    for _ in range(1000):
        if pool.bindings.holds(resolved):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the readied process was never bound")


async def test_a_block_runs_in_the_readied_process_from_its_snapshot(
    pool: RuntimePool, workspaces: Path
) -> None:
    workdir = conversation(workspaces)
    first = await run(pool, "rows = [1, 2]\n", workdir=workdir)
    # The conversation's process went away (another replica ran it, or it expired).
    other = conversation(workspaces)
    await ready(pool, other, first.snapshot)
    block = await run(pool, "rows.append(3)\nresult(rows)\n" + MARK, workdir=other, snapshot=first.snapshot)
    assert (block.status, block.process, block.results[0]) == ("ok", "prepared", "[1, 2, 3]"), block.error
    assert block.snapshot is not None  # written after the block as after any other
    after = await run(pool, "result(rows)\n" + MARK, workdir=other, snapshot=block.snapshot)
    assert (after.process, after.results) == ("live", ["[1, 2, 3]", block.results[1]])


async def test_a_new_conversation_is_readied_without_a_snapshot(pool: RuntimePool, workspaces: Path) -> None:
    workdir = conversation(workspaces)
    await ready(pool, workdir, None)
    block = await run(pool, "import os\nresult(os.getcwd() == os.environ['HOME'])\n", workdir=workdir)
    assert (block.status, block.process, block.results) == ("ok", "prepared", ["True"]), block.error


async def test_the_block_waits_for_a_readying_still_under_way(pool: RuntimePool, workspaces: Path) -> None:
    """The code came before the process was ready: the block waits for it rather than start a
    second process for the conversation."""
    workdir = conversation(workspaces)
    assert prepare(pool, workdir, None)
    block = await run(pool, "x = 1\n", workdir=workdir)
    assert (block.status, block.process) == ("ok", "prepared"), block.error
    assert pool.bindings.holds(await asyncio.to_thread(workdir.resolve))  # live, as after any block


async def test_once_only(pool: RuntimePool, workspaces: Path) -> None:
    """A conversation being readied, or with a process bound already, is not readied again."""
    workdir = conversation(workspaces)
    assert prepare(pool, workdir, None)
    assert not prepare(pool, workdir, None)
    await run(pool, "x = 1\n", workdir=workdir)
    assert not prepare(pool, workdir, None)  # live after its block


async def test_a_readied_process_never_serves_another_conversation(
    pool: RuntimePool, workspaces: Path
) -> None:
    mine, theirs = conversation(workspaces), conversation(workspaces)
    await ready(pool, mine, None)
    other = await run(pool, "secret = 1\n" + MARK, workdir=theirs)
    assert other.process == "fresh"
    block = await run(pool, "result('secret' in globals())\n" + MARK, workdir=mine)
    assert (block.process, block.results[0]) == ("prepared", "False")
    assert block.results[1] != other.results[0]


async def test_another_snapshot_or_other_limits_start_fresh(pool: RuntimePool, workspaces: Path) -> None:
    """Readied from one snapshot, the block comes with another (a turn elsewhere stored it), or
    with other limits: the readied process goes, and the block restores its own snapshot."""
    source = conversation(workspaces)
    one = await run(pool, "x = 1\n", workdir=source)
    two = await run(pool, "x = 2\n", workdir=source, snapshot=one.snapshot)
    workdir = conversation(workspaces)
    await ready(pool, workdir, one.snapshot)
    block = await run(pool, "result(x)\n", workdir=workdir, snapshot=two.snapshot)
    assert (block.process, block.results) == ("fresh", ["2"]), block.error
    other = conversation(workspaces)
    await ready(pool, other, one.snapshot)
    limited = await run(
        pool, "result(x)\n", workdir=other, snapshot=one.snapshot, limits=Limits(cpu_seconds=5)
    )
    assert (limited.process, limited.results) == ("fresh", ["1"]), limited.error


async def test_helpers_kept_in_variables_are_the_blocks_own(pool: RuntimePool, workspaces: Path) -> None:
    """A variable holding a tool restores to the block's tool of that name, as from a fresh
    restore: the readied process restored it with the same names."""
    tools = {"add_one": ["x"]}
    source = conversation(workspaces)
    first = await run(pool, "f = add_one\n", workdir=source, tools=tools)
    assert first.status == "ok", first.error
    workdir = conversation(workspaces)
    await ready(pool, workdir, first.snapshot, tools=tools)
    calls = Recorder(lambda call: CallReply(kind="value", value=call.arguments["x"] + 1))
    block = await run(
        pool, "result(f(x=41))\n", workdir=workdir, snapshot=first.snapshot, tools=tools, on_call=calls
    )
    assert (block.status, block.process, block.results) == ("ok", "prepared", ["42"]), block.error
    assert [call.name for call in calls.calls] == ["add_one"]


async def test_a_snapshot_that_calls_a_tool_as_it_loads_starts_fresh(
    pool: RuntimePool, workspaces: Path
) -> None:
    """Restoring never answers a call: one made by the snapshot's own objects as they load ends
    the readying, and the block starts fresh, where that call is the block's (journaled)."""
    tools = {"add_one": ["x"]}
    source = conversation(workspaces)
    code = "class C:\n    def __reduce__(self):\n        return (add_one, (1,))\nc = C()\n"
    first = await run(pool, code, workdir=source, tools=tools)
    assert first.status == "ok", first.error
    workdir = conversation(workspaces)
    assert pool.prepare(
        snapshot=first.snapshot, workdir=workdir, limits=Limits(), internal_helpers=(), external_tools=tools
    )
    calls = Recorder(lambda call: CallReply(kind="value", value=2))
    block = await run(
        pool, "result(c)\n", workdir=workdir, snapshot=first.snapshot, tools=tools, on_call=calls
    )
    assert (block.status, block.process, block.results) == ("ok", "fresh", ["2"]), block.error
    assert [call.name for call in calls.calls] == ["add_one"]
    assert [entry.name for entry in block.journal] == ["add_one"]


async def test_nothing_is_readied_without_live_processes(workspaces: Path) -> None:
    async with started_pool("process", workspaces, size=1, live_seconds=0.0) as pool:
        workdir = conversation(workspaces)
        assert not prepare(pool, workdir, None)
        block = await run(pool, "x = 1\n", workdir=workdir)
        assert (block.status, block.process) == ("ok", "fresh")


async def test_a_directory_outside_the_workspaces_is_not_readied(pool: RuntimePool) -> None:
    with tempfile.TemporaryDirectory() as outside:  # /tmp: not below the workspaces
        assert not prepare(pool, Path(outside), None)


async def test_names_its_snapshot_could_not_restore_are_reported_with_the_block(
    pool: RuntimePool, workspaces: Path
) -> None:
    """The block says what the restore dropped, as a fresh block restoring the same snapshot
    would: here a module of the first conversation's directory, which the second lacks."""
    source = conversation(workspaces)
    code = "open('mymod.py', 'w').write('X = 1\\n')\nimport mymod\n"
    first = await run(pool, code, workdir=source)
    assert first.status == "ok", first.error
    fresh = await run(pool, "y = 1\n", workdir=conversation(workspaces), snapshot=first.snapshot)
    assert (fresh.process, fresh.dropped) == ("fresh", ["mymod"]), fresh.error
    workdir = conversation(workspaces)
    await ready(pool, workdir, first.snapshot)
    block = await run(pool, "y = 1\n", workdir=workdir, snapshot=first.snapshot)
    assert (block.status, block.process, block.dropped) == ("ok", "prepared", ["mymod"]), block.error


async def test_a_tool_kept_in_a_value_is_the_blocks_own(pool: RuntimePool, workspaces: Path) -> None:
    """A tool held inside a value (a list) restores, in a fresh fork, to the block's tool: so too in
    a readied process, whose restore ran with the readying's own helpers."""
    tools = {"add_one": ["x"]}
    first = await run(pool, "fs = [add_one]\n", workdir=conversation(workspaces), tools=tools)
    assert first.status == "ok", first.error
    workdir = conversation(workspaces)
    await ready(pool, workdir, first.snapshot, tools=tools)
    calls = Recorder(lambda call: CallReply(kind="value", value=call.arguments["x"] + 1))
    code = "result(fs[0](x=41))\n"
    block = await run(pool, code, workdir=workdir, snapshot=first.snapshot, tools=tools, on_call=calls)
    assert (block.status, block.process, block.results) == ("ok", "prepared", ["42"]), block.error
    assert [call.name for call in calls.calls] == ["add_one"]
    again = await run(
        pool, code, workdir=conversation(workspaces), snapshot=block.snapshot, tools=tools, on_call=calls
    )
    assert (again.status, again.results) == ("ok", ["42"]), again.error  # the snapshot kept it


async def test_a_restore_that_journals_a_helper_gives_the_block_a_fresh_start(
    pool: RuntimePool, workspaces: Path
) -> None:
    """Restoring ran FS.write_file (an object's ``__reduce__``): a fresh block journals it first,
    so that its replay meets it again. The readying, which has no block to journal it for, gives
    up: the block starts fresh and its journal is a fresh block's, so a resume replayed from the
    snapshot elsewhere does not diverge."""
    tools = {"ask": ["q"]}
    writes = (
        "class C:\n    def __reduce__(self):\n        return (FS.write_file, ('restored.txt', 'x'))\n"
        "c = C()\n"
    )
    first = await run(pool, writes, workdir=conversation(workspaces), tools=tools)
    assert first.status == "ok", first.error
    code = "result(ask(q=1))\n"
    suspend = Recorder(lambda call: CallReply(kind="suspend"))
    workdir = conversation(workspaces)
    assert prepare(pool, workdir, first.snapshot, tools=tools)
    paused = await run(pool, code, workdir=workdir, snapshot=first.snapshot, tools=tools, on_call=suspend)
    assert (paused.status, paused.process) == ("suspended", "fresh"), paused.error
    assert [entry.name for entry in paused.journal] == ["FS.write_file"]
    assert paused.pending is not None
    journal = [*paused.journal, JournalEntry.for_call(paused.pending, CallReply(kind="value", value=7))]
    resumed = await run(
        pool, code, workdir=conversation(workspaces), snapshot=first.snapshot, tools=tools, journal=journal
    )
    assert (resumed.status, resumed.results) == ("ok", ["7"]), resumed.error
