"""Turn events, streamed turns, background turns and cancel, end to end over HTTP on both stores."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from app.llm.scripted import Reply, ScriptedLLM
from tests.conftest import AppFactory

LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "Look a code up.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
}
TERMINAL = {"completed", "awaiting_tool_results", "failed", "cancelled"}


def block(code: str) -> str:
    return f"Let me look.\n<helpers>\n{code}\n</helpers>"


def parse_sse(text: str) -> list[dict[str, Any]]:
    """The events of an SSE body: id, event and the decoded data of each."""
    events = []
    for chunk in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in chunk.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = fields.get(name, "") + value.removeprefix(" ")
        if "data" in fields:
            events.append(
                {"id": fields.get("id"), "event": fields.get("event"), "data": json.loads(fields["data"])}
            )
    return events


async def all_events(client: httpx.AsyncClient, conversation_id: str) -> list[dict[str, Any]]:
    page = await client.get(f"/v1/conversations/{conversation_id}/events", params={"limit": 500})
    assert page.status_code == 200, page.text
    return page.json()["data"]


async def wait_for_turn(client: httpx.AsyncClient, conversation_id: str, turn_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        turn = (await client.get(f"/v1/conversations/{conversation_id}/turns/{turn_id}")).json()
        if turn["status"] in TERMINAL:
            return turn
        await asyncio.sleep(0.05)
    raise AssertionError(f"turn {turn_id} did not end: {turn}")


async def test_a_turn_records_its_events_as_a_tree(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script(
        block("print('doubled', llm_call(['21'], 'double it'))"),
        "42",
        block("print(lookup(code='a1'))"),
    )
    response = await client.post("/v1/conversations", json={"input": "go", "tools": [LOOKUP]})
    turn = response.json()
    assert turn["status"] == "awaiting_tool_results", turn
    events = await all_events(client, turn["conversation_id"])
    types = [e["type"] for e in events]
    assert types == [
        "turn.started",
        "llm.started",
        "llm.delta",
        "llm.completed",
        "block.started",
        "helper.started",
        "helper.completed",
        "block.completed",
        "llm.started",
        "llm.delta",
        "llm.completed",
        "block.started",
        "tool_calls.pending",
        "turn.awaiting_tool_results",
    ], types
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    by_id = {e["id"]: e for e in events}
    root = events[0]
    assert root["parent_id"] is None
    assert all(e["turn_id"] == turn["turn_id"] for e in events)
    assert by_id[events[2]["parent_id"]]["type"] == "llm.started"  # the delta under its call
    assert by_id[events[5]["parent_id"]]["type"] == "block.started"  # the helper under its block
    assert by_id[events[6]["parent_id"]]["type"] == "helper.started"
    assert events[2]["data"]["text"].startswith("Let me look.")
    assert events[4]["data"]["code"] == "print('doubled', llm_call(['21'], 'double it'))"
    assert events[7]["data"]["status"] == "ok"
    assert "doubled 42" in events[7]["data"]["text"]
    assert events[12]["data"]["tool_calls"][0]["name"] == "lookup"
    assert events[-1]["data"]["status"] == "awaiting_tool_results"
    assert events[-1]["data"]["pending_tool_calls"][0]["id"] == turn["pending_tool_calls"][0]["id"]

    # The resume is a turn of its own, numbered on from the first.
    llm.script("Found it.")
    call = turn["pending_tool_calls"][0]["id"]
    resumed = await client.post(
        f"/v1/conversations/{turn['conversation_id']}/tool-results",
        json={"results": [{"tool_call_id": call, "output": "A-ONE"}]},
    )
    assert resumed.json()["status"] == "completed", resumed.text
    later = (await all_events(client, turn["conversation_id"]))[len(events) :]
    assert later[0]["seq"] == len(events) + 1
    assert [e["type"] for e in later[:2]] == ["turn.started", "tool_results.received"]
    assert later[1]["data"]["results"] == [{"tool_call_id": call, "output": "A-ONE", "error": None}]
    assert later[-1]["type"] == "turn.completed"


async def test_a_sub_task_nests_under_its_helper(make_client: AppFactory, llm: ScriptedLLM) -> None:
    llm.script(block("print(sabre_call('sum 2 and 3'))"), "5", "It is 5.")
    async with make_client(runtime_workers=2) as client:
        turn = (await client.post("/v1/conversations", json={"input": "go"})).json()
        events = await all_events(client, turn["conversation_id"])
    assert turn["status"] == "completed", turn
    by_id = {e["id"]: e for e in events}
    helper = next(e for e in events if e["type"] == "helper.started" and e["data"]["name"] == "sabre_call")
    nested = [e for e in events if e["parent_id"] == helper["id"]]
    assert [e["type"] for e in nested][:1] == ["llm.started"], nested
    assert by_id[nested[0]["parent_id"]]["type"] == "helper.started"


async def test_a_streamed_turn(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script(Reply(text="Hello there, streaming world.", chunk_delay=0.01))
    async with client.stream("POST", "/v1/conversations", json={"input": "hi", "stream": True}) as response:
        assert response.status_code == 201
        assert response.headers["content-type"].startswith("text/event-stream")
        body = (await response.aread()).decode()
    events = parse_sse(body)
    assert next(e["event"] for e in events) == "turn.started"
    assert events[-1]["event"] == "turn.completed"
    assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
    text = "".join(e["data"]["data"]["text"] for e in events if e["event"] == "llm.delta")
    assert text == "Hello there, streaming world."
    final = events[-1]["data"]["data"]
    assert final["status"] == "completed"
    assert final["output"] == "Hello there, streaming world."
    # The store has exactly what was streamed.
    stored = await all_events(client, final["conversation_id"])
    assert [e["id"] for e in stored] == [e["data"]["id"] for e in events]


async def test_a_streamed_request_replays_under_its_idempotency_key(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script("Once.")
    headers = {"Idempotency-Key": "stream-1"}
    body = {"input": "hi", "stream": True}
    first = await client.post("/v1/conversations", json=body, headers=headers)
    again = await client.post("/v1/conversations", json=body, headers=headers)
    assert again.headers.get("idempotent-replayed") == "true"
    assert [e["data"]["id"] for e in parse_sse(again.text)] == [
        e["data"]["id"] for e in parse_sse(first.text)
    ]
    assert len(llm.requests) == 1


async def test_a_background_turn_is_polled_to_its_end(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script(Reply(text="Later.", delay=0.3))
    response = await client.post("/v1/conversations", json={"input": "hi", "background": True})
    assert response.status_code == 202, response.text
    turn = response.json()
    assert turn["status"] in ("queued", "running")
    assert (
        response.headers["location"] == f"/v1/conversations/{turn['conversation_id']}/turns/{turn['turn_id']}"
    )
    busy = await client.post(f"/v1/conversations/{turn['conversation_id']}/messages", json={"input": "more"})
    assert busy.status_code == 409, busy.text
    done = await wait_for_turn(client, turn["conversation_id"], turn["turn_id"])
    assert done["status"] == "completed"
    assert done["output"] == "Later."
    listed = (await client.get(f"/v1/conversations/{turn['conversation_id']}/turns")).json()
    assert [t["turn_id"] for t in listed["data"]] == [turn["turn_id"]]


async def test_bad_last_event_ids(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script("hi")
    conv = (await client.post("/v1/conversations", json={"input": "hi"})).json()["conversation_id"]
    url = f"/v1/conversations/{conv}/events"
    sse = {"Accept": "text/event-stream"}
    assert (await client.get(url, headers={**sse, "Last-Event-ID": "abc"})).status_code == 400
    assert (await client.get(url, headers={**sse, "Last-Event-ID": "999"})).status_code == 404
    assert (await client.get(url, params={"after": 999})).status_code == 404
    assert (await client.get("/v1/conversations/conv_nope/events")).status_code == 404


async def test_cancel_during_a_model_call(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script(Reply(text="slow " * 200, chunk_delay=0.05))
    turn = (await client.post("/v1/conversations", json={"input": "hi", "background": True})).json()
    url = f"/v1/conversations/{turn['conversation_id']}/turns/{turn['turn_id']}"
    await asyncio.sleep(0.3)
    started = time.monotonic()
    cancelled = await client.post(url + "/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert time.monotonic() - started < 5
    again = await client.post(url + "/cancel")
    assert again.status_code == 200
    assert again.json()["status"] == "cancelled"
    events = await all_events(client, turn["conversation_id"])
    assert events[-1]["type"] == "turn.cancelled"
    # The conversation takes the next message.
    llm.script("Fresh.")
    nxt = await client.post(f"/v1/conversations/{turn['conversation_id']}/messages", json={"input": "again"})
    assert nxt.status_code == 200, nxt.text
    assert nxt.json()["status"] == "completed"


async def test_cancel_during_a_long_block(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script(block("import time\nprint('started', flush=True)\ntime.sleep(30)"))
    turn = (await client.post("/v1/conversations", json={"input": "hi", "background": True})).json()
    conversation_id, turn_id = turn["conversation_id"], turn["turn_id"]
    deadline = time.monotonic() + 10
    while not any(e["type"] == "block.started" for e in await all_events(client, conversation_id)):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    started = time.monotonic()
    response = await client.post(f"/v1/conversations/{conversation_id}/turns/{turn_id}/cancel")
    assert response.status_code == 200, response.text
    assert time.monotonic() - started < 5
    assert response.json()["status"] == "cancelled"
    events = await all_events(client, conversation_id)
    assert [e["type"] for e in events][-2:] == ["block.completed", "turn.cancelled"]
    assert events[-2]["data"]["status"] == "cancelled"
    # What it had done so far is stored: the model's block and the note that it was cancelled.
    messages = (await client.get(f"/v1/conversations/{conversation_id}/messages")).json()["data"]
    assert messages[-1]["parts"][0]["kind"] == "helpers_result"
    assert "cancelled" in messages[-1]["parts"][0]["text"]


async def test_cancelling_a_finished_turn_is_409(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script("done")
    turn = (await client.post("/v1/conversations", json={"input": "hi"})).json()
    response = await client.post(
        f"/v1/conversations/{turn['conversation_id']}/turns/{turn['turn_id']}/cancel"
    )
    assert response.status_code == 409, response.text
    other = await client.post(f"/v1/conversations/{turn['conversation_id']}/turns/turn_nope/cancel")
    assert other.status_code == 404


async def test_events_stay_gap_free_when_a_background_write_meets_the_final_transaction(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    """Events written in the background while the turn runs, then the rest in its final
    transaction: a write still under way when that transaction starts must finish first (on
    SQLite it would wait for the transaction's write lock, time out and lose its events)."""
    turns = 12
    for _ in range(turns):
        llm.script(block("print('x')"), "Done.")
    async with make_client(events_flush_seconds=0.001) as client:
        conversation = (await client.post("/v1/conversations", json={"input": "hi"})).json()
        llm.script("Hello.")
        for _ in range(turns):
            turn = await client.post(
                f"/v1/conversations/{conversation['conversation_id']}/messages", json={"input": "go"}
            )
            assert turn.json()["status"] == "completed", turn.text
        events = await all_events(client, conversation["conversation_id"])
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert sum(e["type"] == "turn.completed" for e in events) == turns + 1


async def test_the_end_event_is_the_turn_the_response_and_the_api_show(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    """A turn's end event goes into the statement that stores its outcome, built before it: what
    it says must be what the response says and what the turn reads as later, for a new
    conversation and a resumed one, with an idempotency key (its completion is written in the
    same transaction) and without."""
    for key in (None, "end-event-key"):
        llm.script(block("print(lookup(code='a1'))"), "Found it.")
        headers = {"Idempotency-Key": f"{key}-start"} if key else {}
        started = await client.post(
            "/v1/conversations", json={"input": "go", "tools": [LOOKUP]}, headers=headers
        )
        assert started.status_code == 201, started.text
        first = started.json()
        assert first["status"] == "awaiting_tool_results", first
        conversation_id = first["conversation_id"]
        call = first["pending_tool_calls"][0]["id"]
        headers = {"Idempotency-Key": f"{key}-resume"} if key else {}
        resumed = await client.post(
            f"/v1/conversations/{conversation_id}/tool-results",
            json={"results": [{"tool_call_id": call, "output": "A-ONE"}]},
            headers=headers,
        )
        assert resumed.status_code == 200, resumed.text
        second = resumed.json()
        assert second["status"] == "completed", second
        events = await all_events(client, conversation_id)
        ends = [e for e in events if e["type"] in ("turn.awaiting_tool_results", "turn.completed")]
        assert [e["data"] for e in ends] == [first, second]
        for turn in (first, second):
            shown = await client.get(f"/v1/conversations/{conversation_id}/turns/{turn['turn_id']}")
            # Read later, the first turn no longer shows the calls the second answered.
            assert shown.json() == ({**turn, "pending_tool_calls": []} if turn is first else turn)
