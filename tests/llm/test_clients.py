"""Both LLM clients, through the real openai SDK, over real HTTP to the scripted server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pydantic
import pytest

from app.llm import LLMApi, LLMClient, LLMError, LLMMessage, make_llm_client
from app.llm.scripted import Reply, ScriptedLLM
from tests.llm.conftest import API_KEY

HI = [LLMMessage(role="user", content="hi")]
BLOCK = "Let me look.\n<helpers>\nprint(orders[0])\n</helpers>"
HALLUCINATED = "\n<helpers_result>made up</helpers_result>\nThe order shipped."


class Deltas:
    """An `on_delta` that records what it is given."""

    def __init__(self) -> None:
        self.chunks: list[str] = []

    async def __call__(self, chunk: str) -> None:
        self.chunks.append(chunk)


async def expect_error(client: LLMClient, messages: list[LLMMessage] = HI) -> LLMError:
    with pytest.raises(LLMError) as caught:
        await client.complete(model="m", instructions="", messages=messages)
    return caught.value


def estimate(text: str) -> int:
    return len(text) // 4


async def test_plain_text_reply(scripted: ScriptedLLM, client: LLMClient, api: LLMApi) -> None:
    scripted.script("Hello there, how can I help?")

    response = await client.complete(
        model="gpt-test", instructions="You are terse.", messages=HI, on_delta=Deltas()
    )

    assert response.text == "Hello there, how can I help?"
    assert response.stopped_at_helpers is False
    [request] = scripted.requests
    assert request.api == api
    assert request.stream is True
    assert request.model == "gpt-test"
    assert request.instructions == "You are terse."
    assert request.last_user_text == "hi"


async def test_conversation_roles_are_sent_in_order(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script("third answer")
    messages = [
        LLMMessage(role="user", content="one"),
        LLMMessage(role="assistant", content="two"),
        LLMMessage(role="user", content="three"),
    ]

    await client.complete(model="m", instructions="sys", messages=messages)

    [request] = scripted.requests
    assert [(m.role, m.text) for m in request.messages] == [
        ("user", "one"),
        ("assistant", "two"),
        ("user", "three"),
    ]
    assert request.all_text == "sys\none\ntwo\nthree"


async def test_no_instructions_sends_no_system_prompt(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script("ok")

    await client.complete(model="m", instructions="", messages=HI)

    [request] = scripted.requests
    assert request.instructions == ""
    assert "instructions" not in request.body
    assert [m.role for m in request.messages] == ["user"]


async def test_helpers_block_is_cut_right_after_closing_tag(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script(BLOCK + HALLUCINATED)
    deltas = Deltas()

    response = await client.complete(model="m", instructions="", messages=HI, on_delta=deltas)

    assert response.text == BLOCK
    assert response.stopped_at_helpers is True
    assert "".join(deltas.chunks) == BLOCK


@pytest.mark.parametrize("chunk_size", [1, 3, 7])
async def test_closing_tag_split_across_chunks(
    scripted: ScriptedLLM, client: LLMClient, chunk_size: int
) -> None:
    scripted.script(Reply(text=BLOCK + HALLUCINATED, chunk_size=chunk_size, ignore_stop=True))
    deltas = Deltas()

    response = await client.complete(model="m", instructions="", messages=HI, on_delta=deltas)

    assert response.text == BLOCK
    assert response.stopped_at_helpers is True
    assert "".join(deltas.chunks) == BLOCK


async def test_chat_stop_is_requested_and_dropped_tag_restored(scripted: ScriptedLLM) -> None:
    """A conforming server ends before `</helpers>` and drops it; the client puts it back."""
    scripted.script(BLOCK + HALLUCINATED)
    client = make_llm_client(api="chat", base_url=scripted.base_url, api_key=None, retry_base_delay=0.01)
    deltas = Deltas()
    try:
        response = await client.complete(model="m", instructions="", messages=HI, on_delta=deltas)
    finally:
        await client.aclose()

    assert scripted.requests[0].stop == ["</helpers>"]
    assert response.text == BLOCK
    assert response.stopped_at_helpers is True
    assert deltas.chunks[-1] == "</helpers>"
    assert "".join(deltas.chunks) == BLOCK


async def test_server_ignoring_stop_is_cut_by_the_client(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script(Reply(text=BLOCK + HALLUCINATED, ignore_stop=True))

    response = await client.complete(model="m", instructions="", messages=HI)

    assert response.text == BLOCK
    assert response.stopped_at_helpers is True


async def test_stop_at_helpers_false_returns_everything(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script(BLOCK + HALLUCINATED)

    response = await client.complete(model="m", instructions="", messages=HI, stop_at_helpers=False)

    assert response.text == BLOCK + HALLUCINATED
    assert response.stopped_at_helpers is False
    assert "stop" not in scripted.requests[0].body


async def test_on_delta_receives_chunks_in_order(scripted: ScriptedLLM, client: LLMClient) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    scripted.script(Reply(text=text, chunk_size=5))
    deltas = Deltas()

    await client.complete(model="m", instructions="", messages=HI, on_delta=deltas)

    assert deltas.chunks == [text[i : i + 5] for i in range(0, len(text), 5)]


async def test_paced_stream_arrives_in_pieces(scripted: ScriptedLLM, client: LLMClient) -> None:
    """With `chunk_delay` the server writes event by event, as a generating model does."""
    scripted.script(Reply(text=BLOCK + HALLUCINATED, chunk_size=8, chunk_delay=0.001, ignore_stop=True))
    deltas = Deltas()

    response = await client.complete(model="m", instructions="", messages=HI, on_delta=deltas)

    assert response.text == BLOCK
    assert deltas.chunks[0] == BLOCK[:8]
    assert "".join(deltas.chunks) == BLOCK


async def test_usage_from_the_stream(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script(Reply(text="counted", input_tokens=123, output_tokens=45))

    response = await client.complete(model="m", instructions="", messages=HI)

    assert (response.usage.input_tokens, response.usage.output_tokens) == (123, 45)


async def test_usage_estimated_when_the_server_sends_none(scripted: ScriptedLLM, client: LLMClient) -> None:
    """Cut at `</helpers>` before the usage event: estimate from characters instead of 0."""
    scripted.script(Reply(text=BLOCK + HALLUCINATED, ignore_stop=True, output_tokens=999))
    instructions = "x" * 400

    response = await client.complete(model="m", instructions=instructions, messages=HI)

    assert response.usage.input_tokens == estimate(instructions + "hi") == 100
    assert response.usage.output_tokens == estimate(BLOCK) > 0


async def test_5xx_then_success_is_retried(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script(Reply(status=500), Reply(status=503), "recovered")

    response = await client.complete(model="m", instructions="", messages=HI)

    assert response.text == "recovered"
    assert len(scripted.requests) == 3


async def test_429_every_time_gives_rate_limited(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script(*[Reply(status=429, text="slow down")] * 4, "never served")

    error = await expect_error(client)

    assert error.code == "llm_rate_limited"
    assert error.retryable is True
    assert "slow down" in error.message
    assert len(scripted.requests) == 4  # the first attempt and 3 retries
    assert scripted.pending == 1


async def test_429_with_retry_after_then_success(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script(Reply(status=429, headers={"retry-after": "0.02"}), "fine")

    response = await client.complete(model="m", instructions="", messages=HI)

    assert response.text == "fine"
    assert len(scripted.requests) == 2


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_client_errors_are_bad_request_and_not_retried(
    scripted: ScriptedLLM, client: LLMClient, status: int
) -> None:
    scripted.script(Reply(status=status, text="model 'm' does not exist"), "never served")

    error = await expect_error(client)

    assert error.code == "llm_bad_request"
    assert error.retryable is False
    assert f"HTTP {status}" in error.message
    assert "model 'm' does not exist" in error.message
    assert "{" not in error.message  # the server's message, not a repr of its body
    assert len(scripted.requests) == 1


async def test_garbage_body_gives_bad_response(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script(Reply(garbage=True), "never served")

    error = await expect_error(client)

    assert error.code == "llm_bad_response"
    assert error.retryable is False
    assert len(scripted.requests) == 1


@asynccontextmanager
async def raw_sse_server(events: list[str]) -> AsyncIterator[str]:
    """A one-trick server answering every request with these `data:` events; yields its base URL.

    For streams the scripted server never sends: empty ones, in-stream failures, odd JSON.
    """
    body = "".join(f"data: {event}\n\n" for event in events).encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        server.close()
        await server.wait_closed()


async def raw_error(api: LLMApi, events: list[str]) -> LLMError:
    async with raw_sse_server(events) as base_url:
        client = make_llm_client(api=api, base_url=base_url, api_key=None, max_retries=0)
        try:
            return await expect_error(client)
        finally:
            await client.aclose()


async def test_stream_without_any_event_gives_bad_response(api: LLMApi) -> None:
    """A 200 whose event stream is empty: neither text nor a completion event arrives."""
    error = await raw_error(api, [])

    assert error.code == "llm_bad_response"
    assert "ended without any text" in error.message


async def test_event_that_is_not_an_object_gives_bad_response(api: LLMApi) -> None:
    error = await raw_error(api, ["[1, 2, 3]"])

    assert error.code == "llm_bad_response"


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ('{"type": "error", "message": "overloaded", "code": "server_error"}', "llm_unavailable"),
        (
            '{"type": "response.failed", "response": {"error": '
            '{"code": "rate_limit_exceeded", "message": "overloaded"}}}',
            "llm_rate_limited",
        ),
    ],
)
async def test_responses_failure_events(event: str, code: str) -> None:
    error = await raw_error("responses", [event])

    assert error.code == code
    assert error.retryable is True
    assert "overloaded" in error.message


async def test_chat_error_chunk_gives_unavailable() -> None:
    error = await raw_error("chat", ['{"error": {"message": "overloaded"}}'])

    assert error.code == "llm_unavailable"
    assert "overloaded" in error.message


async def test_chat_without_usage_is_estimated() -> None:
    """Servers that ignore `stream_options` send no usage: tokens are estimated, not 0."""
    chunk = '{"choices": [{"index": 0, "delta": {"content": "%s"}, "finish_reason": %s}]}'
    async with raw_sse_server([chunk % ("word " * 8, "null"), chunk % ("", '"stop"'), "[DONE]"]) as url:
        client = make_llm_client(api="chat", base_url=url, api_key=None)
        try:
            response = await client.complete(model="m", instructions="x" * 38, messages=HI)
        finally:
            await client.aclose()

    assert response.text == "word " * 8
    assert (response.usage.input_tokens, response.usage.output_tokens) == (10, 10)


async def test_connection_refused_gives_unavailable(api: LLMApi) -> None:
    with socket.socket() as sock:  # a port that was just free and has nobody listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = make_llm_client(
        api=api,
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key=API_KEY,
        max_retries=2,
        retry_base_delay=0.01,
    )
    try:
        error = await expect_error(client)
    finally:
        await client.aclose()

    assert error.code == "llm_unavailable"
    assert error.retryable is True
    assert f"127.0.0.1:{port}" in error.message
    assert "connection refused" in error.message  # not a timeout (the aiohttp transport's wording)
    assert "3 attempts" in error.message
    assert API_KEY not in error.message


async def test_timeout_gives_unavailable(scripted: ScriptedLLM, api: LLMApi) -> None:
    scripted.script(Reply(text="late", delay=5), Reply(text="late", delay=5))
    client = make_llm_client(
        api=api,
        base_url=scripted.base_url,
        api_key=None,
        timeout=0.2,
        max_retries=1,
        retry_base_delay=0.01,
    )
    try:
        error = await expect_error(client)
    finally:
        await client.aclose()

    assert error.code == "llm_unavailable"
    assert "timed out" in error.message
    assert len(scripted.requests) == 2


async def test_stream_dying_after_text_is_not_restarted(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script(Reply(text="abcdefghijklmnop", chunk_size=4, disconnect_after=2), "unused")
    deltas = Deltas()

    with pytest.raises(LLMError) as caught:
        await client.complete(model="m", instructions="", messages=HI, on_delta=deltas)

    assert caught.value.code == "llm_unavailable"
    assert caught.value.retryable is True
    assert deltas.chunks == ["abcd", "efgh"]
    assert len(scripted.requests) == 1


async def test_stream_dying_before_text_is_retried(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script(Reply(text="lost", disconnect_after=0), "second try")

    response = await client.complete(model="m", instructions="", messages=HI)

    assert response.text == "second try"
    assert len(scripted.requests) == 2


async def test_exhausted_script_fails_the_call(scripted: ScriptedLLM, client: LLMClient) -> None:
    error = await expect_error(client)

    assert error.code == "llm_unavailable"
    assert "scripted LLM: script exhausted" in error.message
    assert len(scripted.requests) == 4


async def test_api_key_never_appears_in_errors(scripted: ScriptedLLM, client: LLMClient) -> None:
    scripted.script(Reply(status=401, text=f"Incorrect API key provided: {API_KEY}."))

    error = await expect_error(client)

    assert error.code == "llm_unavailable"
    assert error.retryable is False
    assert API_KEY not in error.message
    assert API_KEY not in repr(error)
    assert "***" in error.message
    assert scripted.requests[0].headers["authorization"] == f"Bearer {API_KEY}"


async def test_missing_api_key_sends_a_placeholder(scripted: ScriptedLLM, api: LLMApi) -> None:
    scripted.script("ok")
    client = make_llm_client(api=api, base_url=scripted.base_url, api_key="")
    try:
        response = await client.complete(model="m", instructions="", messages=HI)
    finally:
        await client.aclose()

    assert response.text == "ok"
    assert scripted.requests[0].headers["authorization"] == "Bearer sk-none"


async def test_images_are_sent_in_each_apis_shape(
    scripted: ScriptedLLM, client: LLMClient, api: LLMApi
) -> None:
    image = "data:image/png;base64,iVBORw0KGgo="
    scripted.script("a red square")
    message = LLMMessage(role="user", content="What is this?", images=[image])

    await client.complete(model="m", instructions="sys", messages=[message])

    [request] = scripted.requests
    if api == "responses":
        assert request.body["input"] == [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": image, "detail": "auto"},
                ],
            }
        ]
    else:
        assert request.body["messages"] == [
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": image}},
                ],
            },
        ]
    assert request.messages[0].images == [image]


def test_only_user_messages_carry_images() -> None:
    with pytest.raises(pydantic.ValidationError):
        LLMMessage(role="assistant", content="x", images=["data:image/png;base64,AA=="])


async def test_on_delta_errors_propagate_unchanged(scripted: ScriptedLLM, client: LLMClient) -> None:
    """A failing callback is the caller's bug, not an LLM failure, and is not retried."""
    scripted.script("some text", "unused")

    async def broken(chunk: str) -> None:
        raise ValueError("callback broke")

    with pytest.raises(ValueError, match="callback broke"):
        await client.complete(model="m", instructions="", messages=HI, on_delta=broken)
    assert len(scripted.requests) == 1


async def test_a_lone_surrogate_from_the_model_becomes_the_replacement_character() -> None:
    """A server's JSON may escape half a surrogate pair alone ("\\ud800"), which the SDK decodes
    as is: no UTF-8 encoder takes it, so the turn's output could be neither stored (either store)
    nor sent. Like a NUL, it becomes U+FFFD, in the deltas and the text alike; other text stays."""
    from app.llm.openai_common import TextCollector

    deltas: list[str] = []

    async def on_delta(chunk: str) -> None:
        deltas.append(chunk)

    collector = TextCollector(on_delta=on_delta, stop_at_helpers=True)
    for chunk in ("a\ud800b", "\udfff", "é😀\x00", "plain"):
        await collector.feed(chunk)
    assert collector.text == "a\ufffdb\ufffdé😀\ufffdplain"
    assert "".join(deltas) == collector.text
    collector.text.encode()


async def test_a_surrogate_pair_split_across_two_chunks_is_one_character() -> None:
    """A server may escape an emoji as a surrogate pair and split the pair across two events: the
    halves are joined into the character, not replaced one by one; a first half the stream never
    completes still becomes U+FFFD. The deltas always concatenate to the text."""
    from app.llm.openai_common import TextCollector

    deltas: list[str] = []

    async def on_delta(chunk: str) -> None:
        deltas.append(chunk)

    collector = TextCollector(on_delta=on_delta, stop_at_helpers=True)
    for chunk in ("smile \ud83d", "\ude00!", "\ud83d", "", "\ud83d", "x", "end \ud83d"):
        await collector.feed(chunk)
    await collector.finish()
    assert collector.text == "smile \U0001f600!\ufffd\ufffdxend \ufffd"
    assert "".join(deltas) == collector.text
    collector.text.encode()


async def test_a_reply_past_the_cap_is_cut_there_and_not_retried(scripted: ScriptedLLM, api: LLMApi) -> None:
    """A model server that never stops (hostile, or looping) must not fill the server's memory:
    past ``max_reply_chars`` the stream is closed and the completion fails, keeping nothing of the
    chunk that went over; what was forwarded before stays whole."""
    client = make_llm_client(api=api, base_url=scripted.base_url, api_key=None, max_reply_chars=100)
    scripted.script(Reply(text="x" * 10_000, chunk_size=30), "unused")
    deltas = Deltas()
    try:
        with pytest.raises(LLMError) as caught:
            await client.complete(model="m", instructions="", messages=HI, on_delta=deltas)
    finally:
        await client.aclose()
    assert caught.value.code == "llm_bad_response"
    assert caught.value.retryable is False
    assert "100 characters" in caught.value.message
    assert deltas.chunks == ["x" * 30] * 3
    assert len(scripted.requests) == 1


async def test_a_reply_at_the_cap_is_whole(scripted: ScriptedLLM, api: LLMApi) -> None:
    capped = make_llm_client(api=api, base_url=scripted.base_url, api_key=None, max_reply_chars=100)
    scripted.script(Reply(text="y" * 100, chunk_size=30))
    try:
        response = await capped.complete(model="m", instructions="", messages=HI)
    finally:
        await capped.aclose()
    assert response.text == "y" * 100
