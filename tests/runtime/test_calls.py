"""Calls from the code to the parent: helpers, external tools, suspension and durable replay."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.runtime import CallReply, HelperCall, JournalEntry, Limits, RuntimePool
from tests.runtime.support import Recorder, run

pytestmark = pytest.mark.asyncio(loop_scope="package")


def suspend_external(internal_value: object = "internal answer") -> Recorder:
    """Suspend on every external call; answer internal ones with ``internal_value``."""

    def answer(call: HelperCall) -> CallReply:
        if call.runs == "caller":
            return CallReply(kind="suspend")
        return CallReply(kind="value", value=internal_value)

    return Recorder(answer)


async def test_internal_helper_call_returns_the_parents_value(pool: RuntimePool, tmp_path: Path) -> None:
    recorder = Recorder(lambda call: CallReply(kind="value", value={"text": "hello"}))
    outcome = await run(
        pool,
        "import numpy as np\nanswer = llm_call('hi', np.int64(3), temperature=0)\nresult(answer['text'])\n",
        workdir=tmp_path,
        helpers=["llm_call"],
        on_call=recorder,
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.results == ["hello"]
    assert recorder.calls == [
        HelperCall(
            name="llm_call",
            runs="service",
            args=["hi", 3],
            kwargs={"temperature": 0},
            arguments={},
            line=2,
            code="answer = llm_call('hi', np.int64(3), temperature=0)",
        )
    ]
    [entry] = outcome.journal
    assert entry == JournalEntry(name="llm_call", digest=recorder.calls[0].digest(), value={"text": "hello"})


async def test_internal_arguments_are_best_effort_json(pool: RuntimePool, tmp_path: Path) -> None:
    recorder = Recorder()
    await run(
        pool,
        "class Thing:\n    def __repr__(self):\n        return 'Thing()'\nllm_call(Thing(), {1: (2, 3)})\n",
        workdir=tmp_path,
        helpers=["llm_call"],
        on_call=recorder,
    )
    assert recorder.calls[0].args == ["Thing()", {"1": [2, 3]}]


async def test_error_reply_is_raised_and_catchable(pool: RuntimePool, tmp_path: Path) -> None:
    recorder = Recorder(
        lambda call: CallReply(kind="error", error_type="RateLimited", error_message="slow down")
    )
    outcome = await run(
        pool,
        "try:\n    llm_call('x')\nexcept ToolError as exc:\n    result(f'{exc.error_type}: {exc}')\n"
        "llm_call('y')\n",
        workdir=tmp_path,
        helpers=["llm_call"],
        on_call=recorder,
    )
    assert outcome.results == ["RateLimited: slow down"]
    assert outcome.status == "error"
    assert outcome.error == "Traceback (line 5): ToolError: slow down\n  line 5: llm_call('y')"
    assert [e.error_message for e in outcome.journal] == ["slow down", "slow down"]
    assert [e.error_type for e in outcome.journal] == ["RateLimited", "RateLimited"]


async def test_external_tool_maps_positional_arguments_to_names(pool: RuntimePool, tmp_path: Path) -> None:
    recorder = Recorder(lambda call: CallReply(kind="value", value={"status": "shipped"}))
    outcome = await run(
        pool,
        "order = get_order('A1', verbose=True)\nresult(order['status'])\n",
        workdir=tmp_path,
        tools={"get_order": ["order_id", "verbose"]},
        on_call=recorder,
    )
    assert outcome.results == ["shipped"]
    [call] = recorder.calls
    assert call.runs == "caller"
    assert call.args == ["A1"]
    assert call.kwargs == {"verbose": True}
    assert call.arguments == {"order_id": "A1", "verbose": True}
    assert call.line == 1


async def test_external_tool_argument_errors_stay_in_the_code(pool: RuntimePool, tmp_path: Path) -> None:
    recorder = Recorder()
    outcome = await run(
        pool,
        "for bad in [lambda: get_order('A', 'B'), lambda: get_order('A', order_id='B'),\n"
        "            lambda: get_order(object())]:\n"
        "    try:\n        bad()\n    except TypeError as exc:\n        result(str(exc))\n",
        workdir=tmp_path,
        tools={"get_order": ["order_id"]},
        on_call=recorder,
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.results == [
        "get_order() takes 1 positional arguments but 2 were given",
        "get_order() got multiple values for argument 'order_id'",
        "get_order(): a object is not a JSON value",
    ]
    assert recorder.calls == []


async def test_suspend_then_resume_from_the_journal(replaying_pool: RuntimePool, tmp_path: Path) -> None:
    """Without a live process a resume replays the block: what it printed before the pause is
    printed again, and the journal answers the calls it made."""
    pool = replaying_pool
    base = await run(pool, "base = 10\n", workdir=tmp_path)
    code = (
        "uid = find_user(first_name='Sarah', zip='90210')\n"
        "note = llm_call('summarize', uid)\n"
        "print('looked up', uid)\n"
        "orders = get_orders(uid)\n"
        "print(orders[0]['status'])\n"
        "result(base + len(orders))\n"
    )
    tools = {"find_user": ["first_name", "last_name", "zip"], "get_orders": ["user_id"]}
    recorder = suspend_external()

    async def resume(journal: list[JournalEntry]):  # type: ignore[no-untyped-def]
        return await run(
            pool,
            code,
            workdir=tmp_path,
            snapshot=base.snapshot,
            helpers=["llm_call"],
            tools=tools,
            journal=journal,
            on_call=recorder,
        )

    first = await resume([])
    assert first.status == "suspended"
    assert first.snapshot is None
    assert first.journal == []
    assert first.pending is not None
    assert first.pending.arguments == {"first_name": "Sarah", "zip": "90210"}
    assert first.pending.code == "uid = find_user(first_name='Sarah', zip='90210')"

    journal = [JournalEntry.for_call(first.pending, CallReply(kind="value", value="u1"))]
    second = await resume(journal)
    assert second.status == "suspended"
    assert second.pending is not None
    assert second.pending.name == "get_orders"
    assert second.pending.arguments == {"user_id": "u1"}
    assert [e.name for e in second.journal] == ["find_user", "llm_call"]
    assert second.stdout == "looked up u1\n"

    journal = [
        *second.journal,
        JournalEntry.for_call(second.pending, CallReply(kind="value", value=[{"status": "shipped"}])),
    ]
    calls_before = len(recorder.calls)
    third = await resume(journal)
    assert third.status == "ok", third.error
    assert third.stdout == "looked up u1\nshipped\n"
    assert third.results == ["11"]
    assert third.journal == journal
    assert third.snapshot is not None
    # Everything was answered from the journal: the parent heard nothing, llm_call ran once.
    assert len(recorder.calls) == calls_before
    assert [c.name for c in recorder.calls].count("llm_call") == 1


async def test_a_loop_of_100_external_calls_replays(pool: RuntimePool, tmp_path: Path) -> None:
    code = "total = 0\nfor i in range(100):\n    total += add_one(i)\nresult(total)\n"
    recorder = suspend_external()
    journal: list[JournalEntry] = []
    for _ in range(101):
        outcome = await run(
            pool,
            code,
            workdir=tmp_path,
            tools={"add_one": ["x"]},
            journal=journal,
            on_call=recorder,
        )
        if outcome.status != "suspended":
            break
        assert outcome.pending is not None
        answer = CallReply(kind="value", value=outcome.pending.arguments["x"] + 1)
        journal = [*outcome.journal, JournalEntry.for_call(outcome.pending, answer)]
    assert outcome.status == "ok", outcome.error
    assert outcome.results == ["5050"]
    assert len(outcome.journal) == 100
    assert len(recorder.calls) == 100  # each call reached the parent exactly once


async def test_a_different_call_on_replay_is_a_divergence(pool: RuntimePool, tmp_path: Path) -> None:
    call = HelperCall(
        name="add_one", runs="caller", args=[1], kwargs={}, arguments={"x": 1}, line=1, code=None
    )
    journal = [JournalEntry.for_call(call, CallReply(kind="value", value=2))]
    recorder = Recorder()
    outcome = await run(
        pool,
        "print('start')\ny = add_one(2)\n",
        workdir=tmp_path,
        tools={"add_one": ["x"]},
        journal=journal,
        on_call=recorder,
    )
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.startswith(
        "ReplayDivergenceError: call #1 of the block is add_one(2) at line 2: y = add_one(2); "
        "the journal recorded a call to add_one"
    )
    assert outcome.snapshot is None
    assert outcome.stdout == "start\n"
    assert recorder.calls == []

    renamed = await run(
        pool,
        "y = sub_one(1)\n",
        workdir=tmp_path,
        tools={"add_one": ["x"], "sub_one": ["x"]},
        journal=journal,
    )
    assert renamed.error is not None
    assert "journal recorded a call to add_one" in renamed.error


async def test_fewer_calls_on_replay_is_a_divergence(pool: RuntimePool, tmp_path: Path) -> None:
    call = HelperCall(
        name="add_one", runs="caller", args=[1], kwargs={}, arguments={"x": 1}, line=1, code=None
    )
    journal = [JournalEntry.for_call(call, CallReply(kind="value", value=2))] * 2
    outcome = await run(pool, "y = add_one(1)\n", workdir=tmp_path, tools={"add_one": ["x"]}, journal=journal)
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.startswith("ReplayDivergenceError: the block made 1 calls, but the journal")


async def test_an_error_from_on_call_kills_the_block_and_propagates(
    pool: RuntimePool, tmp_path: Path
) -> None:
    def broken(call: HelperCall) -> CallReply:
        raise LookupError("orchestrator bug")

    with pytest.raises(LookupError):
        await run(pool, "llm_call()\n", workdir=tmp_path, helpers=["llm_call"], on_call=Recorder(broken))
    outcome = await run(pool, "result(1)\n", workdir=tmp_path)
    assert outcome.results == ["1"]


async def test_helpers_survive_in_the_namespace_by_name(pool: RuntimePool, tmp_path: Path) -> None:
    """A helper stored in a variable is saved by name and bound to the next block's helper."""
    first = await run(
        pool, "ask = llm_call\nfns = {'ask': llm_call}\n", workdir=tmp_path, helpers=["llm_call"]
    )
    assert first.dropped == []
    recorder = Recorder(lambda call: CallReply(kind="value", value=call.args[0] * 2))
    second = await run(
        pool,
        "result(ask(2))\nresult(fns['ask'](3))\n",
        workdir=tmp_path,
        helpers=["llm_call"],
        snapshot=first.snapshot,
        on_call=recorder,
    )
    assert second.results == ["4", "6"]


async def test_bad_names_are_refused(pool: RuntimePool, tmp_path: Path) -> None:
    cases: list[tuple[list[str], dict[str, list[str]]]] = [
        (["result"], {}),
        (["a b"], {}),
        (["x"], {"x": []}),
        ([], {"class": []}),
    ]
    for helpers, tools in cases:
        with pytest.raises(ValueError, match=r"helper or tool|reserved|both"):
            await run(pool, "pass", workdir=tmp_path, helpers=helpers, tools=tools)


async def test_calls_from_threads_are_serialised(pool: RuntimePool, tmp_path: Path) -> None:
    recorder = Recorder(lambda call: CallReply(kind="value", value=call.args[0] * 10))
    outcome = await run(
        pool,
        "from concurrent.futures import ThreadPoolExecutor\n"
        "with ThreadPoolExecutor(4) as pool:\n    out = list(pool.map(llm_call, range(20)))\n"
        "result(out)\n",
        workdir=tmp_path,
        helpers=["llm_call"],
        on_call=recorder,
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.results == [str([i * 10 for i in range(20)])]
    assert sorted(c.args[0] for c in recorder.calls) == list(range(20))


async def test_a_reply_that_is_not_json_becomes_an_error_in_the_code(
    pool: RuntimePool, tmp_path: Path
) -> None:
    recorder = Recorder(lambda call: CallReply(kind="value", value=datetime.now(UTC)))
    outcome = await run(
        pool,
        "try:\n    llm_call()\nexcept ToolError as exc:\n    result(exc.error_type)\n",
        workdir=tmp_path,
        helpers=["llm_call"],
        on_call=recorder,
    )
    assert outcome.results == ["TypeError"]
    assert outcome.journal[0].error_type == "TypeError"


async def test_the_wall_clock_stops_while_the_parent_answers(pool: RuntimePool, tmp_path: Path) -> None:
    async def slow(call: HelperCall) -> CallReply:
        await asyncio.sleep(1.5)  # longer than the block's whole wall clock
        return CallReply(kind="value", value="late")

    outcome = await pool.run_block(
        code="result(llm_call())\n",
        snapshot=None,
        workdir=tmp_path,
        limits=Limits(wall_clock_seconds=1),
        internal_helpers=["llm_call"],
        external_tools={},
        journal=(),
        on_call=slow,
    )
    assert outcome.status == "ok", outcome.limit
    assert outcome.results == ["late"]
