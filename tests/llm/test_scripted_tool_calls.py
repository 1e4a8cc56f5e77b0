"""The scripted model's tool-call replies (``Reply.tool_calls``), read by the real openai SDK, streamed and
not, as the LangGraph bench build reads them; text replies from the same server are unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.llm.scripted import Reply, ScriptedLLM, ScriptedToolCall

CALLS = [
    ScriptedToolCall(name="get_order_details", arguments={"order_id": "7"}),
    ScriptedToolCall(name="cancel_order", arguments={"order_id": "7", "reason": "late"}),
]
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


@pytest.fixture(scope="module")
def client(llm: ScriptedLLM) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0) as sdk:
        yield sdk


def test_a_tool_call_reply_reaches_the_sdk_as_tool_calls(llm: ScriptedLLM, client: openai.OpenAI) -> None:
    llm.script(Reply(tool_calls=CALLS))
    choice = client.chat.completions.create(model="m", messages=MESSAGES).choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [  # type: ignore[union-attr]
        (call.name, call.arguments) for call in CALLS
    ]
    assert len({c.id for c in calls}) == 2


def test_a_streamed_tool_call_reply_accumulates_to_the_same_calls(
    llm: ScriptedLLM, client: openai.OpenAI
) -> None:
    llm.script(Reply(tool_calls=CALLS))
    stream = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    finish, usage = None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                if delta.function and delta.function.name:
                    names[delta.index] = delta.function.name
                if delta.function and delta.function.arguments:
                    arguments[delta.index] = arguments.get(delta.index, "") + delta.function.arguments
    assert finish == "tool_calls"
    assert usage is not None
    assert [(names[i], json.loads(arguments[i])) for i in sorted(names)] == [
        (call.name, call.arguments) for call in CALLS
    ]


def test_text_and_error_replies_are_served_as_before(llm: ScriptedLLM, client: openai.OpenAI) -> None:
    llm.script("Hello!", Reply(tool_calls=CALLS, status=500, text="boom"))
    reply = client.chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].message.content == "Hello!"
    assert not reply.choices[0].message.tool_calls
    with pytest.raises(openai.InternalServerError, match="boom"):
        client.chat.completions.create(model="m", messages=MESSAGES)


def test_a_tool_call_reply_is_refused_on_the_responses_api(llm: ScriptedLLM, client: openai.OpenAI) -> None:
    llm.script(Reply(tool_calls=CALLS))
    with pytest.raises(openai.BadRequestError, match="chat completions only"):
        client.responses.create(model="m", input="hi")


def test_a_tool_call_reply_may_say_something_first(llm: ScriptedLLM, client: openai.OpenAI) -> None:
    llm.script(Reply(text="Let me look.", tool_calls=CALLS[:1]))
    message = client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message
    assert message.content == "Let me look."
    assert [c.function.name for c in message.tool_calls or []] == ["get_order_details"]  # type: ignore[union-attr]
