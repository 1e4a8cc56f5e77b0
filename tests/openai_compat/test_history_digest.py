"""The digest that finds a conversation again: the same dialogue however a client echoes it, another
digest for any edit, and the answer's digest equal to the next request's."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from app.conversations.schemas import PendingToolCall, TurnOut, Usage
from app.openai_compat.schemas import ChatCompletionRequest
from app.openai_compat.service import InvalidChat, answer_digest, read_history, tool_output

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_order", "arguments": '{"order_id": "#1"}'},
}


def digests(messages: list[dict[str, Any]], **body: Any) -> list[str]:
    request = ChatCompletionRequest.model_validate({"model": "sabre/default", "messages": messages, **body})
    return read_history(request).digests


BASE: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Where is #1?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
]


def test_the_echoes_clients_send_have_one_digest() -> None:
    echoed = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Where is #1?"}]},
        {
            "role": "assistant",
            "content": "",
            "refusal": None,
            "annotations": [],
            "audio": None,
            "function_call": None,
            "tool_calls": [{**CALL, "function": {"name": "get_order", "arguments": '{"order_id":"#1"}'}}],
        },
        BASE[3],
    ]
    assert digests(echoed) == digests(BASE)
    # tau2's agent (tau2.utils.llm_utils.to_litellm_messages) repeats the name on the call.
    tau2 = [*BASE[:2], {**BASE[2], "tool_calls": [{**CALL, "name": "get_order"}]}, BASE[3]]
    assert digests(tau2) == digests(BASE)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.__setitem__(1, {"role": "user", "content": "Where is #2?"}),
        lambda m: m.__setitem__(0, {"role": "system", "content": "Be long."}),
        lambda m: m[2]["tool_calls"].__setitem__(0, {**CALL, "id": "call_2"}),
        lambda m: m[2]["tool_calls"].__setitem__(
            0, {**CALL, "function": {**CALL["function"], "arguments": "{}"}}
        ),
        lambda m: m.insert(1, {"role": "user", "content": "Hello."}),
    ],
    ids=["user-text", "instructions", "call-id", "arguments", "inserted"],
)
def test_any_edit_changes_the_digest_from_where_it_is(change: Any) -> None:
    edited = [dict(m) for m in BASE]
    edited[2] = {**BASE[2], "tool_calls": list(BASE[2]["tool_calls"])}
    change(edited)
    assert digests(edited)[-1] != digests(BASE)[-1]
    assert digests(BASE, model="sabre/default")[-1] != digests(BASE, model="sabre/coder")[-1]


def test_the_answer_digest_is_the_next_requests() -> None:
    request = ChatCompletionRequest.model_validate({"model": "sabre/default", "messages": BASE[:2]})
    turn = TurnOut(
        conversation_id="conv_1",
        turn_id="turn_1",
        status="awaiting_tool_results",
        output=None,
        pending_tool_calls=[PendingToolCall(id="call_1", name="get_order", arguments={"order_id": "#1"})],
        usage=Usage(),
        version=1,
        created_at=datetime.now(UTC),
    )
    assert answer_digest(read_history(request), turn) == digests(BASE[:3])[-1]


def test_tool_output_decodes_objects_and_arrays_only() -> None:
    assert tool_output('{"a": 1}') == {"a": 1}
    assert tool_output(" [1, 2] ") == [1, 2]
    assert tool_output("42") == "42"
    assert tool_output("sarah_42") == "sarah_42"
    assert tool_output("{not json") == "{not json"


def test_json_in_strings_is_read_as_strictly_as_a_body() -> None:
    with pytest.raises(InvalidChat, match="deeper than 64"):
        tool_output("[" * 100 + "]" * 100)
    with pytest.raises(InvalidChat, match="not a finite number"):
        tool_output('{"a": NaN}')
    with pytest.raises(InvalidChat, match=r"messages\.1"):
        digests(
            [
                {"role": "user", "content": "x"},
                {**BASE[2], "tool_calls": [{**CALL, "function": {"name": "t", "arguments": "[1e999]"}}]},
            ]
        )
