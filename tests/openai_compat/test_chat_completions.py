"""The Chat Completions face with real clients (the `openai` SDK, litellm) over real HTTP, against a
`sabre serve` on each store and the scripted model.

One server per store serves the module; each test draws the model's replies from a plan of its own,
chosen by a token in its user message (tests.events.test_turn_operations.Plans)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from app.llm.scripted import Reply, ScriptedLLM
from app.openai_compat.schemas import MAX_CHAT_MESSAGES
from tests.conversations.test_external_tools import block
from tests.events.test_turn_operations import Plans, _free_port, _tenants, _until_ready
from tests.kit.test_jobs import process

GET_ORDER = {
    "type": "function",
    "function": {
        "name": "get_order_details",
        "description": "Status and items of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}
PARALLEL_BLOCK = block(
    "orders = parallel(get_order_details, [{'order_id': o} for o in ['#1', '#2']])\n"
    "print([o['status'] for o in orders])"
)


@dataclass
class Server:
    url: str
    key: str
    other_key: str
    store: str

    def client(self, *, key: str | None = None) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=key or self.key, max_retries=0)


@pytest.fixture(scope="module")
def plans() -> Plans:
    return Plans()


@pytest.fixture(scope="module")
def model(plans: Plans) -> AsyncIterator[ScriptedLLM]:
    with ScriptedLLM(responder=plans) as server:
        yield server


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> dict[str, str]:
    """The server's store settings: none (the embedded SQLite), or PostgreSQL + Redis."""
    if request.param == "sqlite":
        return {}
    return {
        "SABRE_DATABASE_URL": request.getfixturevalue("module_postgres_url"),
        "SABRE_REDIS_URL": request.getfixturevalue("redis_url"),
    }


@pytest.fixture(scope="module")
async def server(
    store: dict[str, str], model: ScriptedLLM, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Server]:
    """``sabre serve`` on SQLite (embedded) or on PostgreSQL + Redis, with two tenants."""
    name = "postgres" if store else "sqlite"
    root = tmp_path_factory.mktemp(f"chat-{name}")
    keys, auth, other = _tenants()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(root),
        "SABRE_DATA_DIR": str(root / "data"),
        "SABRE_API_KEYS": keys,
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "sk-test",
        "SABRE_LLM_API": "chat",
        "SABRE_LLM_MAX_RETRIES": "0",
        "SABRE_MODEL": "scripted-model",
        "SABRE_RUNTIME_WORKERS": "1",
        "SABRE_RUNTIME_PRELOAD": "",
        "SABRE_BLOCK_WALL_CLOCK_SECONDS": "60",
    }
    env.update(store)
    port = _free_port()
    with ExitStack() as stack:
        serve = ["-m", "app.cli", "serve", "--port", str(port)]
        stack.enter_context(process(serve, env=env, log=root / "serve.log"))
        url = f"http://127.0.0.1:{port}"
        try:
            await _until_ready(url)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{(root / 'serve.log').read_text()[-4000:]}") from None
        yield Server(
            url=url,
            key=auth["Authorization"].removeprefix("Bearer "),
            other_key=other["Authorization"].removeprefix("Bearer "),
            store=name,
        )


def sent_to_model(model: ScriptedLLM, token: str) -> str:
    """Everything the model was sent in its last request for this test's plan."""
    return [r for r in model.requests if token in r.all_text][-1].all_text


async def test_models_are_the_personas(server: Server) -> None:
    models = await server.client().models.list()
    ids = [m.id for m in models.data]
    assert "sabre/default" in ids
    assert "sabre/tau2-retail" in ids
    assert all(m.owned_by == "sabre" for m in models.data)


async def test_parallel_tool_calls_then_an_answer_then_the_next_message(
    server: Server, plans: Plans, model: ScriptedLLM
) -> None:
    token = plans.add(PARALLEL_BLOCK, "Both orders have shipped.", block("print(len(orders))"), "You have 2.")
    client = server.client()
    messages: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"Where are my orders? {token}"},
    ]
    raw = await client.chat.completions.with_raw_response.create(
        model="sabre/default", messages=messages, tools=[GET_ORDER]
    )
    first = raw.parse()
    conversation = raw.headers["sabre-conversation-id"]
    assert first.choices[0].finish_reason == "tool_calls"
    calls = first.choices[0].message.tool_calls
    assert calls is not None
    assert [json.loads(c.function.arguments) for c in calls] == [{"order_id": "#1"}, {"order_id": "#2"}]
    assert first.choices[0].message.content is None
    assert "Be brief." in model.requests[-1].instructions

    # As clients do: the assistant message object itself, then the results (here in reverse order).
    messages.append(first.choices[0].message)
    for call in reversed(calls):
        order = json.loads(call.function.arguments)["order_id"]
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"status": f"shipped {order}"})}
        )
    raw = await client.chat.completions.with_raw_response.create(
        model="sabre/default", messages=messages, tools=[GET_ORDER]
    )
    second = raw.parse()
    assert raw.headers["sabre-conversation-id"] == conversation
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "Both orders have shipped."
    # The JSON results reached the code as dicts.
    assert "['shipped #1', 'shipped #2']" in sent_to_model(model, token)

    messages += [second.choices[0].message, {"role": "user", "content": "How many do I have?"}]
    raw = await client.chat.completions.with_raw_response.create(
        model="sabre/default", messages=messages, tools=[GET_ORDER]
    )
    third = raw.parse()
    assert raw.headers["sabre-conversation-id"] == conversation
    assert third.choices[0].message.content == "You have 2."
    # The same conversation: the namespace of the first turn answered `len(orders)`.
    assert "<helpers_result>\n2\n</helpers_result>" in sent_to_model(model, token)
    assert third.usage is not None
    assert third.usage.total_tokens == third.usage.prompt_tokens + third.usage.completion_tokens > 0

    # The same tool results sent again: that conversation moved on, so this history forks into a new
    # conversation seeded with it (its namespace is empty), never into the old one.
    raw = await client.chat.completions.with_raw_response.create(
        model="sabre/default", messages=messages[:5], tools=[GET_ORDER]
    )
    assert raw.headers["sabre-conversation-id"] != conversation
    assert raw.parse().choices[0].finish_reason == "stop"

    # An edited history (the first user message changed) starts a new conversation seeded with it.
    edit = plans.add("A fresh start.")
    edited = [messages[0], {"role": "user", "content": "Where is my order?"}, *messages[2:-1]]
    edited.append({"role": "user", "content": f"How many? {edit}"})
    raw = await client.chat.completions.with_raw_response.create(
        model="sabre/default", messages=edited, tools=[GET_ORDER]
    )
    assert raw.headers["sabre-conversation-id"] not in (conversation,)
    assert raw.parse().choices[0].message.content == "A fresh start."
    seen = sent_to_model(model, edit)
    assert "<helpers>\nget_order_details(order_id='#1')\nget_order_details(order_id='#2')\n</helpers>" in seen
    assert 'get_order_details(order_id=\'#2\') returned: {"status": "shipped #2"}' in seen


async def test_bad_tool_results_are_the_native_422(server: Server, plans: Plans) -> None:
    token = plans.add(PARALLEL_BLOCK)
    client = server.client()
    messages: list[Any] = [{"role": "user", "content": f"orders {token}"}]
    first = await client.chat.completions.create(model="sabre/default", messages=messages, tools=[GET_ORDER])
    calls = first.choices[0].message.tool_calls
    assert calls is not None
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    one = {"role": "tool", "tool_call_id": calls[0].id, "content": "{}"}
    for results in ([one], [one, {"role": "tool", "tool_call_id": "call_forged", "content": "{}"}]):
        with pytest.raises(openai.UnprocessableEntityError) as caught:
            await client.chat.completions.create(
                model="sabre/default", messages=[*messages, *results], tools=[GET_ORDER]
            )
        assert caught.value.body["code"] == "tool_call_ids_mismatch"  # type: ignore[index]


async def test_streaming_tool_calls_and_content(server: Server, plans: Plans) -> None:
    token = plans.add(PARALLEL_BLOCK, "Both shipped.")
    client = server.client()
    messages: list[Any] = [{"role": "user", "content": f"Stream it {token}"}]
    calls: dict[int, dict[str, str]] = {}
    finish = None
    stream = await client.chat.completions.create(
        model="sabre/default", messages=messages, tools=[GET_ORDER], stream=True
    )
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += delta.id or ""
                entry["name"] += (delta.function.name or "") if delta.function else ""
                entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert [json.loads(c["arguments"]) for c in calls.values()] == [{"order_id": "#1"}, {"order_id": "#2"}]
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls.values()
            ],
        }
    )
    messages += [
        {"role": "tool", "tool_call_id": c["id"], "content": '{"status": "ok"}'} for c in calls.values()
    ]
    text = ""
    usage = None
    stream = await client.chat.completions.create(
        model="sabre/default",
        messages=messages,
        tools=[GET_ORDER],
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    assert text == "Both shipped."
    assert finish == "stop"
    assert usage is not None
    assert usage.total_tokens > 0


async def test_idempotency_key_replays_the_answer(server: Server, plans: Plans) -> None:
    token = plans.add("Once.", "Twice?")
    client = server.client()
    key = {"Idempotency-Key": f"k-{token}"}
    messages = [{"role": "user", "content": f"hello {token}"}]
    first = await client.chat.completions.with_raw_response.create(
        model="sabre/default", messages=messages, extra_headers=key
    )
    again = await client.chat.completions.with_raw_response.create(
        model="sabre/default", messages=messages, extra_headers=key
    )
    assert again.headers["idempotent-replayed"] == "true"
    assert again.parse().id == first.parse().id
    assert again.parse().choices[0].message.content == "Once."
    with pytest.raises(openai.UnprocessableEntityError):
        await client.chat.completions.create(
            model="sabre/default", messages=[{"role": "user", "content": "other"}], extra_headers=key
        )
    # Streamed: the replay follows the same turn's events again.
    streamed = plans.add("Streamed once.", "Streamed twice?")
    body = {
        "model": "sabre/default",
        "messages": [{"role": "user", "content": f"s {streamed}"}],
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {server.key}", "Idempotency-Key": f"k-{streamed}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
        texts = []
        for _ in range(2):
            response = await http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            texts.append(response.text)
    assert response.headers["idempotent-replayed"] == "true"
    for text in texts:
        assert '"content":"Streamed once."' in text
        assert text.rstrip().endswith("data: [DONE]")


async def test_tenants_keys_and_bad_requests(server: Server, plans: Plans) -> None:
    token = plans.add("For tenant one.", "For tenant two.")
    messages: list[Any] = [{"role": "user", "content": f"hi {token}"}]
    raw = await server.client().chat.completions.with_raw_response.create(
        model="sabre/default", messages=messages
    )
    messages += [raw.parse().choices[0].message, {"role": "user", "content": "and?"}]
    # Another tenant sending the same history does not reach tenant one's conversation.
    other = await server.client(key=server.other_key).chat.completions.with_raw_response.create(
        model="sabre/default", messages=messages
    )
    assert other.headers["sabre-conversation-id"] != raw.headers["sabre-conversation-id"]
    # A deleted conversation takes its links with it: the same history then starts a new one.
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {server.key}"}
    ) as http:
        gone = raw.headers["sabre-conversation-id"]
        assert (await http.delete(f"/v1/conversations/{gone}")).status_code == 204
    again = await server.client().chat.completions.with_raw_response.create(
        model="sabre/default", messages=messages
    )
    assert again.headers["sabre-conversation-id"] not in (gone, other.headers["sabre-conversation-id"])
    with pytest.raises(openai.AuthenticationError):
        await server.client(key="sk-wrong").chat.completions.create(model="sabre/default", messages=messages)
    with pytest.raises(openai.NotFoundError):
        await server.client().chat.completions.create(model="sabre/no-such-persona", messages=messages)
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {server.key}"}
    ) as http:
        user = {"role": "user", "content": "a"}
        tool = {"role": "tool", "tool_call_id": "x", "content": "1"}
        call = {"id": "x", "type": "function", "function": {"name": "t", "arguments": "{}"}}
        calls = {"role": "assistant", "tool_calls": [call]}
        image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
        bad_messages: list[list[dict[str, Any]]] = [
            [],
            [user, {"role": "system", "content": "b"}],  # a system message after the start
            [user, {"role": "assistant", "content": "b"}],  # nothing to answer
            [image],
            [tool],  # a result without a call
            [user, tool],
            [user, calls, {**tool, "content": "[" * 100 + "]" * 100}],  # a result nested too deep
            [
                user,
                {**calls, "tool_calls": [{**call, "function": {"name": "t", "arguments": '{"a": NaN}'}}]},
                tool,
            ],
            # Messages the documented schema refuses (schemathesis' negative cases): unknown,
            # missing or mistyped roles, mistyped content, a name over 64 characters, too many.
            [{"role": "AAA", "content": "a"}],
            [{"role": None, "content": "a"}],
            [{"role": 0, "content": "a"}],
            [{"content": "a"}],
            [{"role": "system", "content": 0}],
            [{**user, "name": "0" * 65}],
            [{**user, "content": [{"type": "text"}]}],
            [user] * (MAX_CHAT_MESSAGES + 1),
        ]
        bad_bodies: list[dict[str, Any]] = [{"model": "sabre/default", "messages": m} for m in bad_messages]
        bad_bodies += [
            {"model": "sabre/default", "messages": [user], "n": 2},
            {"model": "sabre/default", "messages": [user], "temprature": 1},  # misspelt
        ]
        for body in bad_bodies:
            response = await http.post("/v1/chat/completions", json=body)
            assert response.status_code == 422, (body, response.text)
            assert response.headers["content-type"].startswith("application/problem+json")
        # A backing model's name longer than a conversation's model may be: the request's fault
        # (before: 422 invalid_history, as if the client's history were wrong).
        long_model = {"model": "sabre/default:" + "m" * 201, "messages": [user]}
        response = await http.post("/v1/chat/completions", json=long_model)
        assert response.status_code == 422, response.text
        assert response.json()["code"] == "invalid_chat_request", response.json()
        # A body over SABRE_MAX_BODY_BYTES is refused before it is parsed: 413, as documented.
        huge = {"model": "sabre/default", "messages": [{**user, "content": "x" * 2_000_001}]}
        response = await http.post("/v1/chat/completions", json=huge)
        assert response.status_code == 413, response.text
        assert response.json()["code"] == "payload_too_large"


async def test_litellm_as_the_client(server: Server, plans: Plans, model: ScriptedLLM) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from the internet
    import litellm

    token = plans.add(PARALLEL_BLOCK, "Shipped, both.", "Streamed.")
    target = {"model": "openai/sabre/default", "api_base": f"{server.url}/v1", "api_key": server.key}
    messages: list[Any] = [{"role": "user", "content": f"orders please {token}"}]
    first = await litellm.acompletion(messages=messages, tools=[GET_ORDER], **target)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert [json.loads(c.function.arguments) for c in calls] == [{"order_id": "#1"}, {"order_id": "#2"}]
    messages.append(choice.message.model_dump())
    messages += [{"role": "tool", "tool_call_id": c.id, "content": '{"status": "shipped"}'} for c in calls]
    second = await litellm.acompletion(messages=messages, tools=[GET_ORDER], **target)
    assert second.choices[0].message.content == "Shipped, both."
    messages += [second.choices[0].message.model_dump(), {"role": "user", "content": "stream please"}]
    stream = await litellm.acompletion(messages=messages, tools=[GET_ORDER], stream=True, **target)
    text = ""
    async for chunk in stream:
        text += chunk.choices[0].delta.content or ""
    assert text == "Streamed."
    # litellm's echo of the answers continued the one conversation: the model never saw the history
    # replayed as a seeded one (a new conversation renders earlier calls as "... returned: ...").
    assert " returned: " not in sent_to_model(model, token)
    assert "<helpers_result>\n['shipped', 'shipped']\n</helpers_result>" in sent_to_model(model, token)


async def test_one_turn_at_a_time_and_failed_turns(server: Server, plans: Plans) -> None:
    down = Reply(status=500, text="provider down")
    token = plans.add("First.", Reply(text="Slow.", delay=1.0), down, down, down, down)
    client = server.client()
    messages: list[Any] = [{"role": "user", "content": f"hi {token}"}]
    first = await client.chat.completions.create(model="sabre/default", messages=messages)
    messages += [first.choices[0].message, {"role": "user", "content": "next"}]
    # The same continuation twice at once: the conversation's lock lets one run, the other is a 409.
    outcomes = await asyncio.gather(
        client.chat.completions.create(model="sabre/default", messages=messages),
        client.chat.completions.create(model="sabre/default", messages=messages),
        return_exceptions=True,
    )
    answers = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, openai.APIStatusError)]
    assert [a.choices[0].message.content for a in answers] == ["Slow."]
    assert len(refused) == 1
    # 409 turn_in_progress; 503 only when SQLite was too busy on a loaded machine to say so.
    assert isinstance(refused[0], openai.ConflictError) or refused[0].status_code == 503, refused
    # A turn that fails (the model's provider answers 500) is an error, not a message.
    messages += [answers[0].choices[0].message, {"role": "user", "content": "and now?"}]
    for _ in range(3):  # a loaded machine may answer 503 (SQLite busy): that one is retried, as clients do
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="sabre/default", messages=messages)
        if caught.value.status_code != 503:
            break
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "turn_failed"  # type: ignore[index]
    # Streamed, the failure comes as an error event, which the SDK raises.
    stream = await client.chat.completions.create(model="sabre/default", messages=messages, stream=True)
    with pytest.raises(openai.APIError) as streamed:
        async for _ in stream:
            pass
    assert streamed.value.message
