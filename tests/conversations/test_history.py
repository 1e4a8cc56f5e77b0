"""A conversation created with a prior history (`messages`): stored as its transcript, shown to the
model, validated strictly."""

from __future__ import annotations

from typing import Any

import httpx

from app.llm.scripted import ScriptedLLM
from tests.conversations.test_bad_input import assert_problem
from tests.conversations.test_external_tools import TOOLS, block

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Hi, I'm Sarah, zip 90210."},
    {"role": "assistant", "content": "Let me look you up.", "tool_calls": [
        {"id": "c1", "name": "find_user_id_by_name_zip",
         "arguments": {"first_name": "Sarah", "last_name": "J", "zip": "90210"}},
    ]},
    {"role": "tool", "tool_call_id": "c1", "output": "sarah_42"},
    {"role": "assistant", "tool_calls": [
        {"id": "c2", "name": "get_order_details", "arguments": {"order_id": "#1"}},
        {"id": "c3", "name": "get_order_details", "arguments": {"order_id": "#2"}},
    ]},
    {"role": "tool", "tool_call_id": "c3", "error": "no such order"},
    {"role": "tool", "tool_call_id": "c2", "output": {"status": "shipped"}},
    {"role": "assistant", "content": "Order #1 has shipped; #2 does not exist."},
]  # fmt: skip


async def test_the_model_sees_the_history_and_the_transcript_keeps_it(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script(block("order = get_order_details(order_id='#3')\nprint(order)"), "Order #3 is pending.")
    response = await client.post(
        "/v1/conversations", json={"messages": HISTORY, "input": "And order #3?", "tools": TOOLS}
    )
    assert response.status_code == 201, response.text
    turn = response.json()
    assert turn["status"] == "awaiting_tool_results"
    [call] = turn["pending_tool_calls"]
    assert call["arguments"] == {"order_id": "#3"}

    sent = [(m.role, m.text) for m in llm.requests[0].messages]
    assert sent == [
        ("user", "Hi, I'm Sarah, zip 90210."),
        (
            "assistant",
            "Let me look you up.<helpers>\n"
            "find_user_id_by_name_zip(first_name='Sarah', last_name='J', zip='90210')\n</helpers>",
        ),
        (
            "user",
            "<helpers_result>\nfind_user_id_by_name_zip(first_name='Sarah', last_name='J', zip='90210') "
            "returned: sarah_42\n</helpers_result>",
        ),
        (
            "assistant",
            "<helpers>\nget_order_details(order_id='#1')\nget_order_details(order_id='#2')\n</helpers>",
        ),
        (
            "user",
            "<helpers_result>\nget_order_details(order_id='#2') raised ToolError: no such order\n"
            'get_order_details(order_id=\'#1\') returned: {"status": "shipped"}\n</helpers_result>',
        ),
        ("assistant", "Order #1 has shipped; #2 does not exist."),
        ("user", "And order #3?"),
    ]
    # The seeded calls are not this turn's: its events and pending calls know only the new one.
    path = f"/v1/conversations/{turn['conversation_id']}"
    events = (await client.get(f"{path}/events")).json()["data"]
    assert not [e for e in events if e["type"] == "tool_results.received"]
    done = await client.post(
        f"{path}/tool-results",
        json={"results": [{"tool_call_id": call["id"], "output": {"status": "pending"}}]},
    )
    assert done.json()["status"] == "completed"
    # Later turns see the history again (from the store this time), rendered the same way.
    assert [(m.role, m.text) for m in llm.requests[1].messages][: len(sent)] == sent

    messages = (await client.get(f"{path}/messages")).json()["data"]
    assert [m["role"] for m in messages[:6]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert messages[1]["parts"][1] == {
        "kind": "tool_call",
        "id": "c1",
        "name": "find_user_id_by_name_zip",
        "arguments": {"first_name": "Sarah", "last_name": "J", "zip": "90210"},
        "code": "find_user_id_by_name_zip(first_name='Sarah', last_name='J', zip='90210')",
        "seeded": True,
    }
    assert [p["tool_call_id"] for p in messages[4]["parts"]] == ["c3", "c2"]
    assert messages[6]["parts"] == [{"kind": "text", "text": "And order #3?"}]
    # The block's own tool call has no `seeded` flag.
    assert "seeded" not in messages[8]["parts"][0]


async def test_an_argument_name_that_is_not_python_is_shown_as_a_dict(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script("Done.")
    history = [
        {
            "role": "assistant",
            "tool_calls": [{"id": "x", "name": "lookup", "arguments": {"class": 1, "a-b": None}}],
        },
        {"role": "tool", "tool_call_id": "x", "output": [1, True, None]},
    ]
    response = await client.post("/v1/conversations", json={"messages": history, "input": "next"})
    assert response.status_code == 201, response.text
    assert "<helpers>\nlookup(**{'class': 1, 'a-b': None})\n</helpers>" in llm.requests[0].all_text
    assert "lookup(**{'class': 1, 'a-b': None}) returned: [1, true, null]" in llm.requests[0].all_text


def _call(call_id: str, name: str = "t") -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": {}}


C1 = {"role": "assistant", "tool_calls": [_call("c1")]}
ANSWER = {"role": "tool", "tool_call_id": "c1", "output": 1}
BAD_HISTORIES: list[tuple[str, list[dict[str, Any]], int, str]] = [
    ("result-no-call", [ANSWER], 422, "invalid_history"),
    ("call-never-answered", [C1], 422, "invalid_history"),
    ("result-after-a-user-message", [C1, {"role": "user", "content": "hm"}, ANSWER], 422, "invalid_history"),
    ("answered-twice", [C1, ANSWER, ANSWER], 422, "invalid_history"),
    ("id-reused", [C1, ANSWER, C1, ANSWER], 422, "invalid_history"),
    ("system-role", [{"role": "system", "content": "x"}], 422, "validation_error"),
    ("empty-assistant", [{"role": "assistant", "content": " "}], 422, "validation_error"),
    ("unknown-field", [{"role": "user", "content": "x", "name": "bob"}], 422, "validation_error"),
    ("output-and-error", [C1, {**ANSWER, "error": "x"}], 422, "validation_error"),
    (
        "tool-name-not-a-name",
        [{"role": "assistant", "tool_calls": [_call("c1", name="bad name(")]}],
        422,
        "validation_error",
    ),
    ("too-many", [{"role": "user", "content": "x"}] * 1001, 422, "validation_error"),
    ("text-too-long", [{"role": "user", "content": "x" * 100_001}], 413, "payload_too_large"),
    ("output-too-large", [C1, {**ANSWER, "output": "x" * 1_000_001}], 413, "payload_too_large"),
]


async def test_bad_histories_are_refused_before_anything_runs(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    for name, history, status, code in BAD_HISTORIES:
        response = await client.post("/v1/conversations", json={"messages": history, "input": "hi"})
        assert response.status_code == status, (name, response.text)
        assert_problem(response, status, code)
    assert llm.requests == []


async def test_without_input_the_model_answers_the_history(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script("Order #1 has shipped.")
    history = HISTORY[:3]  # ends with the result of a tool call
    response = await client.post("/v1/conversations", json={"messages": history})
    assert response.status_code == 201, response.text
    assert response.json()["output"] == "Order #1 has shipped."
    last = llm.requests[0].messages[-1]
    assert last.role == "user"
    assert last.text.startswith("<helpers_result>\nfind_user_id_by_name_zip(")
    for body in ({"messages": HISTORY}, {}, {"messages": []}):  # nothing for the model to answer
        assert_problem(await client.post("/v1/conversations", json=body), 422, "validation_error")
    assert len(llm.requests) == 1


async def test_a_long_seeded_result_is_capped_for_the_model_as_a_blocks_output_is(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script("Seen.")
    history = [
        {"role": "assistant", "tool_calls": [{"id": "big", "name": "dump", "arguments": {}}]},
        {"role": "tool", "tool_call_id": "big", "output": "x" * 20_000},
    ]
    response = await client.post("/v1/conversations", json={"messages": history, "input": "next"})
    assert response.status_code == 201, response.text
    sent = llm.requests[0].all_text
    assert "characters truncated]" in sent
    assert "x" * 20_000 not in sent
    messages = (await client.get(f"/v1/conversations/{response.json()['conversation_id']}/messages")).json()
    assert messages["data"][1]["parts"][0]["output"] == "x" * 20_000  # the transcript keeps it whole
