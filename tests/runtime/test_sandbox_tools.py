"""Persona Python tools (``file.py::function``) run inside the sandbox, journaled like ``FS``."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.runtime import CallReply, JournalEntry, RuntimePool, SandboxTool
from tests.runtime.support import Recorder, run

pytestmark = pytest.mark.asyncio(loop_scope="package")

SOURCE = '''\
import json
import os


class Quote:
    def __init__(self, price):
        self.price = price

    def doubled(self):
        return self.price * 2


def price(sku, quantity=1):
    """Looks a price up and logs the call (a side effect a replay must not repeat)."""
    with open("calls.log", "a") as log:
        log.write(json.dumps([sku, quantity]) + "\\n")
    if sku == "bad":
        raise ValueError(f"unknown sku {sku!r}")
    return {"sku": sku, "total": 2.5 * quantity}


def quote(amount):
    return Quote(amount)


async def later(value):
    return [value, value]
'''


def tool(name: str, function: str, params: tuple[str, ...]) -> SandboxTool:
    return SandboxTool(
        name=name, params=params, file="/srv/personas/tools/shop.py", function=function, source=SOURCE
    )


PRICE = tool("get_price", "price", ("sku", "quantity"))


def calls_logged(workdir: Path) -> list[str]:
    log = workdir / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


async def test_a_tool_runs_in_the_sandbox_with_positional_and_keyword_arguments(
    pool: RuntimePool, tmp_path: Path
) -> None:
    recorder = Recorder()
    outcome = await run(
        pool,
        "a = get_price('A1')\nb = get_price('B2', quantity=4)\nresult(a)\nresult(b['total'])\n",
        workdir=tmp_path,
        sandbox_tools=[PRICE],
        on_call=recorder,
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.results == ['{"sku": "A1", "total": 2.5}', "10.0"]
    assert recorder.calls == []  # nothing reached the parent
    assert [(e.name, e.value) for e in outcome.journal] == [
        ("get_price", {"sku": "A1", "total": 2.5}),
        ("get_price", {"sku": "B2", "total": 10.0}),
    ]
    assert calls_logged(tmp_path) == ['["A1", 1]', '["B2", 4]']


async def test_a_paused_block_replays_the_tool_instead_of_running_it_again(
    pool: RuntimePool, tmp_path: Path
) -> None:
    code = "p = get_price('A1', 3)\nanswer = ask_user(p['total'])\nresult(answer)\n"
    suspend = Recorder(lambda call: CallReply(kind="suspend"))
    first = await run(
        pool, code, workdir=tmp_path, sandbox_tools=[PRICE], tools={"ask_user": ["q"]}, on_call=suspend
    )
    assert first.status == "suspended", first.error
    assert first.pending is not None
    assert first.pending.arguments == {"q": 7.5}
    answered = Recorder(lambda call: CallReply(kind="value", value="yes"))
    journal = [*first.journal]
    resumed = await run(
        pool,
        code,
        workdir=tmp_path,
        sandbox_tools=[PRICE],
        tools={"ask_user": ["q"]},
        journal=journal,
        on_call=Recorder(lambda call: CallReply(kind="suspend")),
    )
    assert resumed.status == "suspended"  # the same pending call again: the journal replayed
    journal.append(JournalEntry.for_call(first.pending, CallReply(kind="value", value="yes")))
    final = await run(
        pool,
        code,
        workdir=tmp_path,
        sandbox_tools=[PRICE],
        tools={"ask_user": ["q"]},
        journal=journal,
        on_call=answered,
    )
    assert final.status == "ok", final.error
    assert final.results == ["yes"]
    assert calls_logged(tmp_path) == ['["A1", 3]']  # ran once, in the first run


async def test_an_error_in_the_tool_reaches_the_code_and_is_journaled(
    pool: RuntimePool, tmp_path: Path
) -> None:
    code = "try:\n    get_price('bad')\nexcept ValueError as exc:\n    result(str(exc))\nget_price('bad')\n"
    outcome = await run(pool, code, workdir=tmp_path, sandbox_tools=[PRICE])
    assert outcome.status == "error"
    assert outcome.results == ["unknown sku 'bad'"]
    assert outcome.error is not None
    assert outcome.error.startswith("Traceback (line 5): ValueError: unknown sku 'bad'")
    assert [(e.name, e.error_type) for e in outcome.journal] == [("get_price", "ValueError")] * 2
    replayed = await run(pool, code, workdir=tmp_path, sandbox_tools=[PRICE], journal=outcome.journal)
    assert replayed.results == ["unknown sku 'bad'"]  # raised again from the journal, as ValueError
    assert len(calls_logged(tmp_path)) == 2


async def test_bad_calls_and_non_json_results_say_what_is_wrong(pool: RuntimePool, tmp_path: Path) -> None:
    quote = tool("make_quote", "quote", ("amount",))
    missing = tool("ghost", "nowhere", ())
    cases = {
        "get_price('A', 1, 2)": "TypeError: get_price() takes 2 positional arguments but 3 were given",
        "get_price('A', sku='B')": "TypeError: get_price() got multiple values for argument 'sku'",
        "get_price(colour='red')": "TypeError: price() got an unexpected keyword argument 'colour'",
        "make_quote(3)": "TypeError: make_quote() returned Quote, which is not JSON",
        "ghost()": "NameError: shop.py does not define a function 'nowhere'",
    }
    for code, expected in cases.items():
        outcome = await run(pool, code, workdir=tmp_path, sandbox_tools=[PRICE, quote, missing])
        assert outcome.status == "error", code
        assert expected in (outcome.error or ""), code


async def test_async_tools_and_tools_held_in_variables_survive_snapshots(
    pool: RuntimePool, tmp_path: Path
) -> None:
    later = tool("twice", "later", ("value",))
    first = await run(pool, "pair = twice('x')\nalias = twice\n", workdir=tmp_path, sandbox_tools=[later])
    assert first.status == "ok", first.error
    assert first.dropped == []
    outcome = await run(
        pool,
        "result(pair)\nresult(alias(2))\n",
        workdir=tmp_path,
        sandbox_tools=[later],
        snapshot=first.snapshot,
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.results == ['["x", "x"]', "[2, 2]"]


async def test_a_tool_cannot_take_a_runtime_name(pool: RuntimePool, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="reserved by the runtime"):
        await run(pool, "pass", workdir=tmp_path, sandbox_tools=[tool("result", "price", ())])
    with pytest.raises(ValueError, match="both a helper and a tool"):
        await run(pool, "pass", workdir=tmp_path, helpers=["get_price"], sandbox_tools=[PRICE])
