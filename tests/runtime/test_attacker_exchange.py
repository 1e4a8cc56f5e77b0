"""The answers to a block's calls, as the server holds them (found by the attacker pass): they stay in
the block's journal until it ends, so a loop over a service tool with large results (an MCP tool that
returns a document) grew the server by every answer. Past ``MAX_JOURNAL_BYTES`` a call gets a
``ToolError`` instead of its value. A socket pair stands for the worker, as in test_exchange.py."""

from __future__ import annotations

import asyncio

from app.runtime.protocol import MAX_JOURNAL_BYTES
from app.runtime.schemas import CallReply, HelperCall
from app.runtime.worker_process import WorkerProcess
from tests.runtime.test_exchange import (  # noqa: F401 (pair: the fixture)
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
