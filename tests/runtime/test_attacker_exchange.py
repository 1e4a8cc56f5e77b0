"""The answers to a block's calls, as the server holds them (found by the attacker pass): they stay in
the block's journal until it ends, so a loop over a service tool with large results (an MCP tool that
returns a document) grew the server by every answer. Past ``MAX_JOURNAL_BYTES`` a call gets a
``ToolError`` instead of its value. A socket pair stands for the worker, as in test_exchange.py."""

from __future__ import annotations

import asyncio

import pytest

from app.runtime.exchange import Exchange
from app.runtime.frames import BlockFailed
from app.runtime.protocol import MAX_JOURNAL_BYTES, call_digest, journal_bytes
from app.runtime.schemas import CallReply, HelperCall, JournalEntry
from app.runtime.worker_process import WorkerProcess
from tests.runtime.test_exchange import (  # noqa: F401 (pair: the fixture)
    LIMITS,
    NAMES,
    FakeWorker,
    _call,
    _done,
    _exchange,
    _request,
    pair,
)

BIG = 3 * 1024 * 1024


class Sized:
    """``on_call``: a value of ``size`` characters."""

    async def __call__(self, call: HelperCall) -> CallReply:
        return CallReply(kind="value", value="x" * int(call.kwargs["size"]))


async def test_answers_past_the_journal_cap_are_refused(
    pair: tuple[WorkerProcess, FakeWorker],  # noqa: F811
) -> None:
    worker, fake = pair
    running = asyncio.ensure_future(_exchange(worker, Sized()).run(_request(), keep=False))  # type: ignore[arg-type]
    await fake.receive()
    replies = []
    for size in [BIG] * 12 + [10]:
        await fake.frame(_call("llm_call", size=size))
        replies.append(await fake.receive())
    fits = MAX_JOURNAL_BYTES // BIG  # 10
    assert [reply["kind"] for reply in replies] == ["value"] * fits + ["error"] * (12 - fits) + ["value"]
    refused = replies[fits]
    assert refused["error_type"] == "ToolError"
    assert f"the answers to this block's calls passed {MAX_JOURNAL_BYTES} bytes" in refused["error_message"]
    await fake.frame(_done())
    async with asyncio.timeout(5):
        outcome = await running
    assert outcome is not None
    held = sum(len(entry.value or "") for entry in outcome.journal if not entry.failed)
    assert held <= MAX_JOURNAL_BYTES


async def test_the_replayed_journal_counts_toward_the_cap(
    pair: tuple[WorkerProcess, FakeWorker],  # noqa: F811
) -> None:
    """A resumed block's answers start from the journal it replays: a block that paused and resumed
    many times used to add up to the cap again in every run, so what every resume stores, loads
    and replays grew without bound."""
    worker, fake = pair
    earlier = JournalEntry.of(
        "lookup",
        call_digest(name="lookup", args=[], kwargs={"key": 1}),
        value="x" * (MAX_JOURNAL_BYTES - BIG),
        error=None,
    )
    assert MAX_JOURNAL_BYTES - BIG < journal_bytes([earlier.to_wire()]) <= MAX_JOURNAL_BYTES
    exchange = Exchange(worker=worker, limits=LIMITS, names=NAMES, journal=[earlier], on_call=Sized())
    running = asyncio.ensure_future(exchange.run(_request(), keep=False))
    await fake.receive()
    await fake.frame(_call("llm_call", size=10))
    small = await fake.receive()
    await fake.frame(_call("llm_call", size=BIG))
    refused = await fake.receive()
    assert small["kind"] == "value"
    assert (refused["kind"], refused["error_type"]) == ("error", "ToolError")
    assert f"passed {MAX_JOURNAL_BYTES} bytes" in refused["error_message"]
    await fake.frame(_done(replayed=1))
    async with asyncio.timeout(5):
        outcome = await running
    assert outcome is not None
    assert journal_bytes([entry.to_wire() for entry in outcome.journal]) <= MAX_JOURNAL_BYTES + 1000


async def test_records_past_what_the_replay_left_are_a_violation(
    pair: tuple[WorkerProcess, FakeWorker],  # noqa: F811
) -> None:
    """The child refuses a record once the journal it replays plus its records reach the cap (the
    block's code gets RecordTooLarge); a worker that sends one anyway is lying, and the block fails."""
    worker, fake = pair
    earlier = JournalEntry.of(
        "lookup",
        call_digest(name="lookup", args=[], kwargs={"key": 1}),
        value="x" * (MAX_JOURNAL_BYTES - 1000),
        error=None,
    )
    exchange = Exchange(worker=worker, limits=LIMITS, names=NAMES, journal=[earlier], on_call=Sized())
    running = asyncio.ensure_future(exchange.run(_request(), keep=False))
    await fake.receive()
    digest = call_digest(name="FS.read_file", args=["a"], kwargs={})
    await fake.frame({"t": "record", "name": "FS.read_file", "digest": digest, "value": "y" * 5000})
    with pytest.raises(BlockFailed, match="journal is too large"):
        async with asyncio.timeout(5):
            await running
