"""``parallel(...)``: several external calls in one pause, answered in any order, replayed exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.runtime import BlockOutcome, CallReply, HelperCall, JournalEntry, RuntimePool
from tests.runtime.support import Recorder, run
from tests.runtime.test_attacks import _FRAME

pytestmark = pytest.mark.asyncio(loop_scope="package")

TOOLS = {"get_order": ["order_id"], "get_user": ["user_id"]}


def suspend_external(call: HelperCall) -> CallReply:
    if call.runs == "caller":
        return CallReply(kind="suspend")
    return CallReply(kind="value", value=f"internal:{call.name}")


def answers(outcome: BlockOutcome) -> list[JournalEntry]:
    """Journal entries answering every pending call with ``{"id": <its order_id>}``."""
    return [
        JournalEntry.for_call(call, CallReply(kind="value", value={"id": call.arguments.get("order_id")}))
        for call in outcome.all_pending
    ]


async def test_one_pause_carries_every_call_and_the_block_gets_every_value(
    pool: RuntimePool, tmp_path: Path
) -> None:
    code = (
        "ids = ['#1', '#2', '#3']\n"
        "orders = parallel(get_order, [{'order_id': i} for i in ids])\n"
        "print([o['id'] for o in orders])\n"
    )
    recorder = Recorder(suspend_external)
    first = await run(pool, code, workdir=tmp_path, tools=TOOLS, on_call=recorder)
    assert first.status == "suspended"
    assert [c.arguments for c in first.all_pending] == [{"order_id": i} for i in ("#1", "#2", "#3")]
    assert all(
        c.code == "orders = parallel(get_order, [{'order_id': i} for i in ids])" for c in first.all_pending
    )
    assert first.journal == []
    # The caller answers in any order: the batch matches its answers call by call.
    journal = list(reversed(answers(first)))
    second = await run(pool, code, workdir=tmp_path, tools=TOOLS, journal=journal, on_call=recorder)
    assert second.status == "ok", second.error
    assert second.stdout == "['#1', '#2', '#3']\n"
    assert len(recorder.calls) == 3  # nothing reached the parent on replay


async def test_pairs_mix_tools_helpers_and_plain_functions(
    replaying_pool: RuntimePool, tmp_path: Path
) -> None:
    """(Replayed, not parked: a parked block's pause reports no stdout, a replay's does.)"""
    pool = replaying_pool
    code = (
        "def count(obj):\n"
        "    return len(obj)\n"
        "user, order, n, note = parallel([\n"
        "    (get_user, {'user_id': 'u1'}),\n"
        "    (get_order, {'order_id': '#9'}),\n"
        "    (count, {'obj': 'abc'}),\n"
        "    (llm_call, {'expr_list': [1], 'instructions': 'x'}),\n"
        "])\n"
        "print(user, order, n, note)\n"
        "later = get_order(order_id='#10')\n"
        "print(later)\n"
    )
    recorder = Recorder(suspend_external)
    tools = TOOLS
    first = await run(pool, code, workdir=tmp_path, tools=tools, helpers=["llm_call"], on_call=recorder)
    assert first.status == "suspended", first.error
    assert [c.name for c in first.all_pending] == ["get_user", "get_order"]
    # The helper ran (once, before the pause) and is journaled ahead of the batch.
    assert [e.name for e in first.journal] == ["llm_call"]
    journal = [
        *first.journal,
        JournalEntry.for_call(first.all_pending[0], CallReply(kind="value", value="U")),
        JournalEntry.for_call(first.all_pending[1], CallReply(kind="value", value="O")),
    ]
    second = await run(
        pool, code, workdir=tmp_path, tools=tools, helpers=["llm_call"], journal=journal, on_call=recorder
    )
    assert second.status == "suspended"
    assert second.stdout == "U O 3 internal:llm_call\n"
    assert second.more_pending == []
    assert second.pending is not None
    assert second.pending.arguments == {"order_id": "#10"}
    assert [c.name for c in recorder.calls].count("llm_call") == 1


async def test_errors_are_raised_after_every_call_or_returned_in_place(
    pool: RuntimePool, tmp_path: Path
) -> None:
    code = (
        "got = parallel(get_order, ['#1', '#2'], return_exceptions=True)\n"
        "print([type(g).__name__ for g in got], got[1])\n"
        "try:\n"
        "    parallel(get_order, ['#1', '#2'])\n"
        "except ToolError as exc:\n"
        "    print('raised', exc)\n"
    )
    first = await run(pool, code, workdir=tmp_path, tools=TOOLS, on_call=Recorder(suspend_external))
    assert first.status == "suspended"
    assert len(first.all_pending) == 2
    journal = [
        JournalEntry.for_call(first.all_pending[0], CallReply(kind="value", value={"ok": 1})),
        JournalEntry.for_call(first.all_pending[1], CallReply(kind="error", error_message="no order #2")),
    ]
    second = await run(
        pool, code, workdir=tmp_path, tools=TOOLS, journal=journal, on_call=Recorder(suspend_external)
    )
    assert second.status == "suspended"  # the second parallel(...) pauses in its turn
    journal = [*journal, *journal]
    third = await run(pool, code, workdir=tmp_path, tools=TOOLS, journal=journal, on_call=Recorder())
    assert third.status == "ok", third.error
    assert third.stdout == "['dict', 'ToolError'] no order #2\nraised no order #2\n"


async def test_a_call_the_parent_refuses_is_answered_and_the_rest_still_pause_together(
    pool: RuntimePool, tmp_path: Path
) -> None:
    def refuse_bad(call: HelperCall) -> CallReply:
        if call.arguments.get("order_id") == "bad":
            return CallReply(kind="error", error_type="ToolArgumentError", error_message="bad id")
        return CallReply(kind="suspend")

    code = "got = parallel(get_order, ['#1', 'bad', '#3', 'bad'], return_exceptions=True)\nprint(got)\n"
    first = await run(pool, code, workdir=tmp_path, tools=TOOLS, on_call=Recorder(refuse_bad))
    assert first.status == "suspended"
    assert [c.arguments["order_id"] for c in first.all_pending] == ["#1", "#3"]
    assert [e.error_type for e in first.journal] == ["ToolArgumentError", "ToolArgumentError"]
    journal = [*first.journal, *answers(first)]
    second = await run(pool, code, workdir=tmp_path, tools=TOOLS, journal=journal, on_call=Recorder())
    assert second.status == "ok", second.error
    assert second.stdout == "[{'id': '#1'}, ToolError('bad id'), {'id': '#3'}, ToolError('bad id')]\n"


async def test_nothing_to_wait_for_means_no_pause(pool: RuntimePool, tmp_path: Path) -> None:
    recorder = Recorder(lambda call: CallReply(kind="value", value=call.arguments["order_id"] * 2))
    code = "print(parallel(get_order, ['a', 'b']), parallel(get_order, []))\n"
    outcome = await run(pool, code, workdir=tmp_path, tools=TOOLS, on_call=recorder)
    assert outcome.status == "ok", outcome.error
    assert outcome.stdout == "['aa', 'bb'] []\n"


async def test_a_changed_batch_on_replay_is_a_divergence(pool: RuntimePool, tmp_path: Path) -> None:
    first = await run(
        pool,
        "parallel(get_order, ['#1', '#2'])\n",
        workdir=tmp_path,
        tools=TOOLS,
        on_call=Recorder(suspend_external),
    )
    journal = answers(first)
    changed = await run(
        pool, "parallel(get_order, ['#1', '#3'])\n", workdir=tmp_path, tools=TOOLS, journal=journal
    )
    assert changed.status == "error"
    assert changed.error is not None
    assert "ReplayDivergenceError" in changed.error
    assert '"#3"' in changed.error
    longer = await run(
        pool, "parallel(get_order, ['#1', '#2', '#4'])\n", workdir=tmp_path, tools=TOOLS, journal=journal
    )
    assert longer.status == "error"
    assert longer.error is not None
    assert "ReplayDivergenceError" in longer.error


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("parallel(5)", "TypeError: parallel needs parallel(tool, items)"),
        ("parallel(get_order, 'abc')", "items must be a list"),
        ("parallel([(get_order, ['#1'])])", "must be a dict of keyword arguments"),
        ("parallel([get_order])", "must be a (tool, {keyword arguments}) pair"),
        (
            "parallel(get_order, [{'order_id': object()}])",
            "TypeError: get_order(): a object is not a JSON value",
        ),
        ("parallel(get_order, [{1: 'x'}])", "keyword argument names must be strings"),
        ("parallel(get_order, ['#1'] * 200)", "more than 128"),
    ],
)
async def test_misuse_raises_in_the_code(pool: RuntimePool, tmp_path: Path, call: str, message: str) -> None:
    recorder = Recorder(suspend_external)
    outcome = await run(pool, call + "\n", workdir=tmp_path, tools=TOOLS, on_call=recorder)
    assert outcome.status == "error"
    assert outcome.error is not None
    assert message in outcome.error, outcome.error
    assert recorder.calls == []


@pytest.mark.parametrize(
    "frames",
    [
        "call('a', [1, 2])",  # starts in the middle of a batch
        "call('a', [0, 2]) + call('b', None)",  # a plain call inside the batch
        "call('a', [0, 2]) + call('b', [0, 3])",  # the batch changes its size
        "call('a', [0, 999])",  # larger than allowed
    ],
)
async def test_forged_batches_fail_the_block(pool: RuntimePool, tmp_path: Path, frames: str) -> None:
    code = (
        _FRAME
        + """\
def call(key, batch):
    c = {"name": "get_order", "runs": "caller", "args": [], "kwargs": {"order_id": key},
         "arguments": {"order_id": key}, "line": 1, "code": "x"}
    f = {"t": "call", "digest": "0" * 64, "call": c}
    if batch is not None:
        f["batch"] = batch
    return frame(f)
"""
        + f"os.write(3, {frames})\nimport time\ntime.sleep(3)\n"
    )
    outcome = await run(pool, code, workdir=tmp_path, tools=TOOLS, on_call=Recorder(suspend_external))
    assert outcome.status == "error"
    assert outcome.error is not None
    assert "SandboxError" in outcome.error
