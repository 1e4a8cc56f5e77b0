"""Live conversation processes: the process that ran a conversation's block stays bound to that
conversation, and its next block runs in it (no fork, no snapshot restore) only when that is the
same as replaying from the store: the same conversation, the snapshot it left, the same limits."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from app.runtime import CallReply, HelperCall, Limits, RuntimePool, SandboxTool
from app.runtime.protocol import LIVE_MAX_BLOCKS
from tests.runtime.support import BACKENDS, Recorder, conversation, run, started_pool

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The process's own mark (pids repeat across bwrap's PID namespaces): set by the first block a
# process runs, kept by a live process, absent from a fresh fork of the worker.
PID = (
    "import os, sys\n"
    "sys.sabre_mark = getattr(sys, 'sabre_mark', None) or os.urandom(8).hex()\n"
    "result(sys.sabre_mark)\n"
)
HOST_PID = "import os\nresult(os.getpid())\n"


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=BACKENDS)
async def live(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """Three workers (two processes may stay bound), no preloads: quick to start."""
    async with started_pool(request.param, workspaces, size=3, live_seconds=30.0) as pool:
        yield pool


async def test_the_next_block_runs_in_the_same_process_with_its_objects(
    live: RuntimePool, workspaces: Path
) -> None:
    workdir = conversation(workspaces)
    first = await run(live, "rows = [1, 2]\nresult(id(rows))\n" + PID, workdir=workdir)
    assert first.status == "ok", first.error
    assert live.live_processes >= 1
    second = await run(
        live,
        "rows.append(3)\nresult(id(rows))\nresult(rows)\n" + PID,
        workdir=workdir,
        snapshot=first.snapshot,
    )
    assert second.status == "ok", second.error
    assert second.results[0] == first.results[0]  # the same object, not an unpickled copy
    assert second.results[1] == "[1, 2, 3]"
    assert second.results[2] == first.results[1]  # the same process
    assert (first.process, second.process) == ("fresh", "live")
    assert second.snapshot is not None  # still written after every block


async def test_a_snapshot_from_elsewhere_starts_a_fresh_process(live: RuntimePool, workspaces: Path) -> None:
    """Another replica ran a block in between: the stored snapshot is not the one the live
    process left, so the block runs in a fresh fork from the stored one."""
    workdir = conversation(workspaces)
    first = await run(live, "x = 1\n" + PID, workdir=workdir)
    elsewhere = await run(live, "x = 2\n", workdir=conversation(workspaces))
    second = await run(live, "result(x)\n" + PID, workdir=workdir, snapshot=elsewhere.snapshot)
    assert second.status == "ok", second.error
    assert second.results[0] == "2"
    assert second.results[1] != first.results[0]
    assert second.process == "fresh"


async def test_a_live_process_never_serves_another_conversation(live: RuntimePool, workspaces: Path) -> None:
    """Another conversation sending the very snapshot the live process holds still gets a fresh
    process: a process is bound to its conversation's directory."""
    mine, theirs = conversation(workspaces), conversation(workspaces)
    first = await run(live, "secret = 'mine'\nopen('private.txt', 'w').write('x')\n" + PID, workdir=mine)
    other = await run(live, PID + "result(os.listdir('.'))\n", workdir=theirs, snapshot=first.snapshot)
    assert other.status == "ok", other.error
    assert other.results[0] != first.results[0]
    assert other.results[1] == "[]"
    again = await run(live, "result(secret)\n" + PID, workdir=mine, snapshot=first.snapshot)
    assert again.results == ["mine", first.results[0]]  # still live for its own conversation


async def test_changed_limits_start_a_fresh_process(live: RuntimePool, workspaces: Path) -> None:
    workdir = conversation(workspaces)
    first = await run(live, PID, workdir=workdir)
    second = await run(live, PID, workdir=workdir, snapshot=first.snapshot, limits=Limits(cpu_seconds=5))
    assert second.results != first.results


async def test_a_live_process_keeps_only_what_a_snapshot_keeps(live: RuntimePool, workspaces: Path) -> None:
    """Parity with a replay: an unpicklable value is dropped; a variable holding a tool of the
    last block holds this block's tool of that name, or a stand-in raising NameError."""
    workdir = conversation(workspaces)
    first = await run(
        live,
        "gen = (i for i in range(3))\nfind = lookup\n" + PID,
        workdir=workdir,
        tools={"lookup": ["order_id"]},
    )
    assert first.dropped == ["gen"]
    recorder = Recorder(lambda call: CallReply(kind="value", value="found"))
    second = await run(
        live,
        "result('gen' in globals())\nresult(find(order_id='A1'))\n" + PID,
        workdir=workdir,
        snapshot=first.snapshot,
        tools={"lookup": ["order_id"]},
        on_call=recorder,
    )
    assert second.status == "ok", second.error
    assert second.results == ["False", "found", first.results[0]]
    assert [call.name for call in recorder.calls] == ["lookup"]
    third = await run(
        live,
        "try:\n    find(order_id='A1')\nexcept NameError as e:\n    result(str(e))\n"
        "result('lookup' in globals())\n" + PID,
        workdir=workdir,
        snapshot=second.snapshot,
    )
    assert third.status == "ok", third.error
    assert third.results == ["helper 'lookup' is not available in this block", "False", first.results[0]]


async def test_a_block_that_imports_numpy_itself_stays_live(live: RuntimePool, workspaces: Path) -> None:
    """numpy not preloaded: importing it in the block must not start OpenBLAS's thread pool, which
    would keep the process from staying live (one thread left running ends it, below)."""
    workdir = conversation(workspaces)
    first = await run(
        live, "import numpy as np\nm = np.ones((64, 64)) @ np.ones((64, 64))\n" + PID, workdir=workdir
    )
    assert first.status == "ok", first.error
    second = await run(live, "result(float(m[0, 0]))\n" + PID, workdir=workdir, snapshot=first.snapshot)
    assert second.status == "ok", second.error
    assert second.process == "live"
    assert second.results == ["64.0", first.results[0]]


async def test_a_thread_left_running_ends_the_process(live: RuntimePool, workspaces: Path) -> None:
    """A thread the block started would run on into the next block: the process is not kept."""
    workdir = conversation(workspaces)
    first = await run(
        live,
        "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\n" + PID,
        workdir=workdir,
    )
    second = await run(live, PID, workdir=workdir, snapshot=first.snapshot)
    assert second.status == "ok", second.error
    assert second.results != first.results


async def test_what_a_block_started_dies_with_the_block(live: RuntimePool, workspaces: Path) -> None:
    """A process kept live still loses what its block left running, as an exited one would."""
    workdir = conversation(workspaces)
    first = await run(
        live,
        "import subprocess\nchild = subprocess.Popen(['sleep', '60'])\nresult(child.pid)\n" + PID,
        workdir=workdir,
    )
    assert first.status == "ok", first.error
    second = await run(
        live,
        "child.poll()\nresult(child.returncode)\n" + PID,
        workdir=workdir,
        snapshot=first.snapshot,
    )
    # `child` (a Popen) is not picklable, so a replay would not have it; live, it is dropped too.
    assert second.status == "error"
    assert "NameError" in (second.error or "")
    third = await run(
        live,
        f"import os\ntry:\n    os.kill({first.results[0]}, 0)\n    result('alive')\n"
        "except ProcessLookupError:\n    result('gone')\n" + PID,
        workdir=workdir,
        snapshot=second.snapshot or first.snapshot,
    )
    assert third.results[1] == first.results[1]  # the live process, where a zombie would linger
    assert third.results[0] == "gone"  # killed at the block's end, and reaped before the next


async def test_cpu_time_is_counted_per_block_in_a_live_process(live: RuntimePool, workspaces: Path) -> None:
    """The hard CPU limit of a live process spans its blocks; the worker holds each block to its
    own limit, even when the code ignores SIGXCPU."""
    workdir = conversation(workspaces)
    limits = Limits(cpu_seconds=1, wall_clock_seconds=20)
    first = await run(live, "x = sum(range(10**6))\n" + PID, workdir=workdir, limits=limits)
    spin = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n"
    second = await run(live, spin, workdir=workdir, snapshot=first.snapshot, limits=limits)
    assert second.status == "limit"
    assert second.limit == "cpu_time 1s"
    third = await run(live, "result(x)\n" + PID, workdir=workdir, snapshot=first.snapshot, limits=limits)
    assert third.status == "ok", third.error
    assert third.results[1] != first.results[0]  # a fresh process, from the stored snapshot


async def test_a_live_process_that_dies_between_blocks_is_replaced(
    live: RuntimePool, workspaces: Path
) -> None:
    """Killed while idle (the OOM killer, an operator): the next block runs, correctly, in a
    fresh fork from the stored snapshot."""
    if live.sandbox != "process":
        pytest.skip("the test finds the child by its host pid (process backend)")
    workdir = conversation(workspaces)
    first = await run(live, "x = 41\n" + HOST_PID + PID, workdir=workdir)
    os.kill(int(first.results[0]), signal.SIGKILL)
    await asyncio.sleep(0.2)
    second = await run(live, "result(x + 1)\n" + PID, workdir=workdir, snapshot=first.snapshot)
    assert second.status == "ok", second.error
    assert second.results[0] == "42"
    assert second.results[1] != first.results[1]


async def test_a_signal_between_blocks_waits_for_the_next_block(live: RuntimePool, workspaces: Path) -> None:
    """Nothing runs in a live process between its blocks: a signal sent then (here to a handler that
    forges a frame) is held until the next block starts, where the forged frame breaks that block's
    protocol and the block fails; the block after it runs in a fresh fork."""
    if live.sandbox != "process":
        pytest.skip("the test signals the child by its host pid (process backend)")
    workdir = conversation(workspaces)
    code = (
        "import os, signal, struct\n"
        "def speak(*_):\n"
        '    body = b\'{"t": "call"}\'\n'
        "    os.write(3, struct.pack('>II', len(body), 0) + body)\n"
        "signal.signal(signal.SIGUSR1, speak)\n"
        "x = 1\n" + HOST_PID + PID
    )
    first = await run(live, code, workdir=workdir)
    assert first.status == "ok", first.error
    kept = live.live_processes
    os.kill(int(first.results[0]), signal.SIGUSR1)
    await asyncio.sleep(0.3)
    assert live.live_processes == kept  # it said nothing: still live
    second = await run(live, "result(x)\n" + PID, workdir=workdir, snapshot=first.snapshot)
    assert (second.status, second.failure, second.process) == ("error", "protocol_violation", "live")
    third = await run(live, "result(x)\n" + PID, workdir=workdir, snapshot=first.snapshot)
    assert third.status == "ok", third.error
    assert third.results[0] == "1"
    assert third.results[1] != first.results[1]


# -- the live processes' memory budget ------------------------------------------------------------

# Memory the block's process keeps without its namespace (a library's cache, say): not in the
# snapshot, so only the live process holds it. Filled, so that it is resident.
HOLD = "import sys\nsys.sabre_held = b'x' * ({mb} << 20)\n"


@pytest_asyncio.fixture(loop_scope="module", params=BACKENDS)
async def budgeted(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """Three workers; live processes may hold 100 MiB together beyond their fork."""
    async with started_pool(
        request.param, workspaces, size=3, live_seconds=30.0, live_processes=4, live_memory_mb=100
    ) as pool:
        yield pool


async def test_a_process_holding_more_than_the_budget_is_not_kept_live(
    budgeted: RuntimePool, workspaces: Path
) -> None:
    workdir = conversation(workspaces)
    first = await run(budgeted, HOLD.format(mb=160) + "x = 1\n" + PID, workdir=workdir)
    assert first.status == "ok", first.error
    assert budgeted.live_processes == 0
    second = await run(budgeted, "result(x)\n" + PID, workdir=workdir, snapshot=first.snapshot)
    assert second.status == "ok", second.error
    assert second.results[0] == "1"  # replayed from the snapshot, in a fresh fork
    assert second.process == "fresh"
    assert second.results[1] != first.results[0]


async def test_past_the_memory_budget_the_least_recently_used_live_process_goes(
    budgeted: RuntimePool, workspaces: Path
) -> None:
    """Two conversations hold 60 MiB each: both fit the count, not the memory; the older one goes."""
    older, newer = conversation(workspaces), conversation(workspaces)
    a = await run(budgeted, HOLD.format(mb=60) + PID, workdir=older)
    b = await run(budgeted, HOLD.format(mb=60) + PID, workdir=newer)
    assert (a.status, b.status) == ("ok", "ok"), (a.error, b.error)
    assert budgeted.live_processes == 1
    again_b = await run(budgeted, PID, workdir=newer, snapshot=b.snapshot)
    again_a = await run(budgeted, PID, workdir=older, snapshot=a.snapshot)
    assert (again_b.process, again_b.results[0]) == ("live", b.results[0])
    assert again_a.process == "fresh"
    # Small ones stay together: the budget counts what each holds, not how many there are.
    small = [conversation(workspaces) for _ in range(3)]
    for path in small:
        assert (await run(budgeted, "x = 1\n", workdir=path)).status == "ok"
    assert budgeted.live_processes >= 3


async def test_a_block_cannot_understate_what_its_process_holds(
    budgeted: RuntimePool, workspaces: Path
) -> None:
    """The memory weighed is the worker's measurement: a block that forges its own ``done``
    frame saying it stays live and holds nothing is still not kept."""
    workdir = conversation(workspaces)
    forged = {
        "t": "done",
        "status": "ok",
        "stdout": "",
        "results": ["forged"],
        "error": None,
        "limit": None,
        "dropped": [],
        "replayed": 0,
        "live": True,
        "grown_kb": 0,
    }
    code = (
        HOLD.format(mb=160)
        + "import os\nfrom app.runtime.protocol import encode_frame\n"
        + f"os.write(3, encode_frame({forged!r}))\n"
        + "os.read(3, 1)  # waits, as a live process waits for its next block\n"
    )
    outcome = await run(budgeted, code, workdir=workdir)
    assert outcome.results == ["forged"]  # the worker took the frame as the block's end
    assert budgeted.live_processes == 0
    assert (await run(budgeted, "result(6 * 7)", workdir=conversation(workspaces))).results == ["42"]


async def test_a_block_that_hides_its_process_still_has_its_memory_counted(
    budgeted: RuntimePool, workspaces: Path
) -> None:
    """A block that makes its process non-dumpable (under bwrap, /proc then hides it from a new
    open by the worker) is measured all the same: past the budget, it is not kept live."""
    workdir = conversation(workspaces)
    hide = "import ctypes\nassert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0\n"  # PR_SET_DUMPABLE
    outcome = await run(budgeted, hide + HOLD.format(mb=160) + "x = 1\n", workdir=workdir)
    assert outcome.status == "ok", outcome.error
    assert budgeted.live_processes == 0


async def test_the_disk_quota_holds_for_a_block_of_a_live_process(
    live: RuntimePool, workspaces: Path
) -> None:
    """A live process's next block is measured against the directory as it was when the block
    started, like a fresh one: writing past the quota and ending at once is still a limit."""
    workdir = conversation(workspaces)
    limits = Limits(disk_mb=2)
    first = await run(live, "x = 1\n" + PID, workdir=workdir, limits=limits)
    assert first.status == "ok", first.error
    fill = "open('big', 'wb').write(b'x' * (8 << 20))\n"
    second = await run(live, fill, workdir=workdir, snapshot=first.snapshot, limits=limits)
    assert second.process == "live"
    assert (second.status, second.limit) == ("limit", "disk 2MB")


# Whether the process of pid ``{pid}`` (a variable of the block) still exists.
ALIVE = "try:\n    os.kill({pid}, 0)\n    result('alive')\nexcept ProcessLookupError:\n    result('gone')\n"


HIDE = "import ctypes, os, time\nassert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0\n"
# A child of the hidden block, and three generations below it (its own children cannot be
# listed: they come to the worker once their parent is dead, and die then).
LEFTOVERS = {
    "child": "pid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)\nresult(pid)\n",
    "great-grandchild": (
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    if os.fork() == 0:\n"
        "        if os.fork() == 0:\n"
        "            os.write(w, str(os.getpid()).encode())\n"
        "            time.sleep(60)\n"
        "        time.sleep(60)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "pid = int(os.read(r, 32))\nresult(pid)\n"
    ),
}


@pytest.mark.parametrize("leftover", sorted(LEFTOVERS))
async def test_what_a_hidden_block_started_dies_with_the_block(
    live: RuntimePool, workspaces: Path, leftover: str
) -> None:
    """The same when the block makes its process non-dumpable first (under bwrap, /proc then
    hides it, and what it forks, from a new open by the worker): its leftovers still die,
    however deep."""
    workdir = conversation(workspaces)
    first = await run(live, HIDE + LEFTOVERS[leftover] + PID, workdir=workdir)
    assert first.status == "ok", first.error
    second = await run(live, ALIVE.format(pid="pid") + PID, workdir=workdir, snapshot=first.snapshot)
    assert second.results[1] == first.results[1]  # the live process
    assert second.results[0] == "gone"


async def test_after_its_last_block_a_live_process_gives_way_to_a_fresh_one(
    live: RuntimePool, workspaces: Path
) -> None:
    """A live process runs ``LIVE_MAX_BLOCKS`` blocks (its hard CPU limit has room for that many),
    then the conversation's next block runs in a fresh fork from the snapshot, which stays live in
    turn; the conversation's state goes on through the rollover."""
    workdir = conversation(workspaces)
    code = "n = globals().get('n', 0) + 1\nresult(n)\n" + PID
    snapshot: bytes | None = None
    seen: list[tuple[str, str, str]] = []
    for _ in range(LIVE_MAX_BLOCKS + 2):
        outcome = await run(live, code, workdir=workdir, snapshot=snapshot)
        assert outcome.status == "ok", outcome.error
        snapshot = outcome.snapshot
        seen.append((outcome.process, outcome.results[0], outcome.results[1]))
    processes, counts, marks = zip(*seen, strict=True)
    assert processes == ("fresh", *["live"] * (LIVE_MAX_BLOCKS - 1), "fresh", "live")
    assert counts == tuple(str(i) for i in range(1, LIVE_MAX_BLOCKS + 3))
    assert len(set(marks[:LIVE_MAX_BLOCKS])) == 1
    assert marks[LIVE_MAX_BLOCKS] == marks[LIVE_MAX_BLOCKS + 1] != marks[0]


async def test_a_tool_kept_in_a_value_is_the_next_blocks_own(live: RuntimePool, workspaces: Path) -> None:
    """A tool an earlier block put in a list (not a variable of its own, which the next block
    rebinds) is, in the live process's next block, that block's tool of the name: as in a fresh
    fork, where the snapshot restores it by name. Called alone or in a ``parallel`` batch (one
    pause for the batch), and kept in the snapshot after it."""
    tools = {"ask": ["q"]}
    workdir = conversation(workspaces)
    first = await run(live, "fs = [ask]\n", workdir=workdir, tools=tools)
    assert first.status == "ok", first.error
    answers = Recorder(lambda call: CallReply(kind="value", value=call.arguments["q"] * 2))
    second = await run(
        live, "result(fs[0](q=21))\n", workdir=workdir, snapshot=first.snapshot, tools=tools, on_call=answers
    )
    assert (second.status, second.process, second.results) == ("ok", "live", ["42"]), second.error
    assert second.snapshot is not None
    suspend = Recorder(lambda call: CallReply(kind="suspend"))
    third = await run(
        live,
        "result(parallel(fs[0], [{'q': 1}, {'q': 2}]))\n",
        workdir=workdir,
        snapshot=second.snapshot,
        tools=tools,
        on_call=suspend,
    )
    assert (third.status, third.process) == ("suspended", "live"), third.error
    assert len(third.all_pending) == 2  # one pause carries the batch
    fresh = await run(
        live,
        "result(fs[0](q=1))\n",
        workdir=conversation(workspaces),
        snapshot=second.snapshot,
        tools=tools,
        on_call=answers,
    )
    assert (fresh.status, fresh.results) == ("ok", ["2"]), fresh.error


TOOLS = {"ask": ["q"]}


def double(call: HelperCall) -> CallReply:
    return CallReply(kind="value", value=call.arguments["q"] * 2)


# An ordinary decorator: functools.wraps copies the tool's __dict__ onto the wrapper (a mark kept
# there once made the wrapper pass for the tool).
WRAPPED = (
    "import functools\n"
    "def plus_one(fn):\n"
    "    @functools.wraps(fn)\n"
    "    def wrapper(**kwargs):\n"
    "        return fn(**kwargs) + 1\n"
    "    return wrapper\n"
    "ask1 = plus_one(ask)\n"
)


async def test_parallel_runs_a_functools_wraps_wrapper_of_a_tool(live: RuntimePool, workspaces: Path) -> None:
    """parallel(wrapper, items) must run the wrapper (which calls the tool), not the bare tool."""
    outcome = await run(
        live,
        WRAPPED + "result(ask1(q=1))\nresult(parallel(ask1, [{'q': 1}, {'q': 2}]))\n",
        workdir=conversation(workspaces),
        tools=TOOLS,
        on_call=Recorder(double),
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.results == ["3", "[3, 5]"]


async def test_a_snapshot_keeps_a_functools_wraps_wrapper_of_a_tool(
    live: RuntimePool, workspaces: Path
) -> None:
    """The snapshot stores the wrapper by value, not as the tool it wraps: a fresh restore calls the
    wrapper, as the live process does."""
    workdir = conversation(workspaces)
    first = await run(live, WRAPPED, workdir=workdir, tools=TOOLS)
    assert first.status == "ok", first.error
    code = "result(ask1(q=1))\n"
    in_live = await run(
        live, code, workdir=workdir, snapshot=first.snapshot, tools=TOOLS, on_call=Recorder(double)
    )
    fresh = await run(
        live,
        code,
        workdir=conversation(workspaces),
        snapshot=first.snapshot,
        tools=TOOLS,
        on_call=Recorder(double),
    )
    assert (in_live.status, in_live.process, in_live.results) == ("ok", "live", ["3"]), in_live.error
    assert (fresh.status, fresh.results) == ("ok", ["3"]), fresh.error


SOURCE = "def price(sku):\n    return {'sku': sku}\n"
PRICE = SandboxTool(
    name="get_price", params=("sku",), file="/srv/personas/tools/shop.py", function="price", source=SOURCE
)
CALL_KEPT = "try:\n    result(fs[0]('A1'))\nexcept NameError as exc:\n    result('NameError')\n"


async def test_a_persona_tool_kept_in_a_value_is_gone_when_the_next_block_lacks_it(
    live: RuntimePool, workspaces: Path
) -> None:
    """As for a caller's tool: a fresh restore makes fs[0] a stand-in raising NameError; the live
    process must too."""
    workdir = conversation(workspaces)
    first = await run(live, "fs = [get_price]\n", workdir=workdir, sandbox_tools=[PRICE])
    assert first.status == "ok", first.error
    fresh = await run(live, CALL_KEPT, workdir=conversation(workspaces), snapshot=first.snapshot)
    assert (fresh.status, fresh.results) == ("ok", ["NameError"]), fresh.error
    in_live = await run(live, CALL_KEPT, workdir=workdir, snapshot=first.snapshot)
    assert in_live.process == "live"
    assert (in_live.status, in_live.results) == ("ok", ["NameError"]), in_live.error


async def test_a_persona_tool_kept_in_a_value_is_the_next_blocks_own(
    live: RuntimePool, workspaces: Path
) -> None:
    """With the tool in the next block too: its own, journaled by that block, as after a restore."""
    workdir = conversation(workspaces)
    first = await run(live, "fs = [get_price]\n", workdir=workdir, sandbox_tools=[PRICE])
    assert first.status == "ok", first.error
    code = "result(fs[0]('A1'))\n"
    in_live = await run(live, code, workdir=workdir, snapshot=first.snapshot, sandbox_tools=[PRICE])
    fresh = await run(
        live, code, workdir=conversation(workspaces), snapshot=first.snapshot, sandbox_tools=[PRICE]
    )
    assert (in_live.status, in_live.process, in_live.results) == ("ok", "live", ['{"sku": "A1"}']), (
        in_live.error
    )
    assert (fresh.status, fresh.results) == ("ok", in_live.results), fresh.error
    assert (
        [entry.name for entry in in_live.journal] == [entry.name for entry in fresh.journal] == ["get_price"]
    )
