"""A turn whose conversation has no live process on this replica (it expired, or the last turn ran
elsewhere) readies one while the model writes its block: as soon as the streamed answer opens
``<helpers>``, a fresh child enters the conversation's directory and restores its snapshot
(the pool's side: tests/runtime/test_prepare.py)."""

from __future__ import annotations

import asyncio

import httpx

from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory


def processes(metrics: str) -> dict[str, float]:
    """``sabre_block_processes_total`` by process."""
    counts: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith('sabre_block_processes_total{process="'):
            counts[line.split('"')[1]] = float(line.split()[-1])
    return counts


async def blocks_by_process(client: httpx.AsyncClient) -> dict[str, float]:
    return processes((await client.get("/metrics")).text)


async def test_a_returning_conversations_block_runs_in_a_process_readied_for_it(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    async with make_client(runtime_live_seconds=0.2, runtime_workers=2) as client:
        llm.script("<helpers>\nrows = [1, 2]\n</helpers>", "first done")
        first = (await client.post("/v1/conversations", json={"input": "start"})).json()
        assert first["status"] == "completed", first
        await asyncio.sleep(0.6)  # its process is let go: the next turn's block would start fresh
        before = await blocks_by_process(client)
        llm.script("<helpers>\nrows.append(3)\nprint(rows)\n</helpers>", "second done")
        second = await client.post(
            f"/v1/conversations/{first['conversation_id']}/messages", json={"input": "again"}
        )
        assert second.json()["status"] == "completed", second.text
        after = await blocks_by_process(client)
    assert after.get("prepared", 0) == before.get("prepared", 0) + 1
    assert after.get("fresh", 0) == before.get("fresh", 0)
    assert "[1, 2, 3]" in llm.requests[-1].last_user_text


async def test_a_new_conversation_and_a_live_one_are_not_readied(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    """Nothing to restore (a new conversation: a fresh child is as quick), or a process live
    already (the turn's next block runs in it)."""
    async with make_client(runtime_live_seconds=30, runtime_workers=2) as client:
        before = await blocks_by_process(client)  # the counters are the process's, for all tests
        llm.script("<helpers>\nrows = [1, 2]\n</helpers>", "<helpers>\nrows.append(3)\n</helpers>", "done")
        turn = (await client.post("/v1/conversations", json={"input": "start"})).json()
        assert turn["status"] == "completed", turn
        after = await blocks_by_process(client)
    grown = {kind: after.get(kind, 0) - before.get(kind, 0) for kind in ("fresh", "live", "prepared")}
    assert grown == {"fresh": 1, "live": 1, "prepared": 0}
