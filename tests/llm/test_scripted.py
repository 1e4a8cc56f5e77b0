"""The scripted server on its own: wire shapes, queueing, recording, concurrency, shutdown."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from app.llm.scripted import EXHAUSTED_MESSAGE, RecordedRequest, Reply, ScriptedLLM

BLOCK = "<helpers>\nprint(1)\n</helpers>"
TRAILING = "\n<helpers_result>1</helpers_result> and more"


def sdk(llm: ScriptedLLM) -> openai.OpenAI:
    return openai.OpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0)


def sse_data(body: str) -> list[dict[str, object]]:
    events = []
    for line in body.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line.removeprefix("data: ")))
    return events


def test_replies_are_fifo_across_both_endpoints_without_streaming() -> None:
    with ScriptedLLM(["first", Reply(text="second", input_tokens=7, output_tokens=3)]) as llm:
        client = sdk(llm)
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
        response = client.responses.create(model="m", instructions="be brief", input="hi")
        client.close()

    assert chat.choices[0].message.content == "first"
    assert chat.choices[0].finish_reason == "stop"
    assert chat.usage is not None
    assert chat.usage.completion_tokens == len("first") // 4
    assert response.output_text == "second"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (7, 3)
    assert [r.path for r in llm.requests] == ["/v1/chat/completions", "/v1/responses"]
    assert llm.requests[1].instructions == "be brief"
    assert llm.requests[1].last_user_text == "hi"


def test_responses_stream_carries_the_whole_text_even_past_helpers() -> None:
    """Cutting at `</helpers>` is the client's job, so the server streams everything."""
    with ScriptedLLM([Reply(text=BLOCK + TRAILING, chunk_size=4)]) as llm:
        body = httpx.post(
            f"{llm.base_url}/responses", json={"model": "m", "input": "go", "stream": True}
        ).text

    events = sse_data(body)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(str(d) for d in deltas) == BLOCK + TRAILING
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_responses_stream_parses_with_the_sdk() -> None:
    with ScriptedLLM([Reply(text="streamed words", chunk_size=3)]) as llm:
        client = sdk(llm)
        with client.responses.create(model="m", input="go", stream=True) as stream:
            kinds = [event.type for event in stream]
        client.close()

    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 5
    assert kinds[-1] == "response.completed"


def test_chat_stream_honours_stop_like_a_real_server() -> None:
    with ScriptedLLM([BLOCK + TRAILING]) as llm:
        client = sdk(llm)
        stream = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "go"}],
            stream=True,
            stop=["</helpers>"],
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        client.close()

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "<helpers>\nprint(1)\n"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(text) // 4


def test_chat_stream_sends_usage_only_when_asked() -> None:
    with ScriptedLLM(["abc"]) as llm:
        body = httpx.post(
            f"{llm.base_url}/chat/completions",
            json={"model": "m", "messages": [], "stream": True},
        ).text

    assert body.endswith("data: [DONE]\n\n")
    assert all(event["usage"] is None for event in sse_data(body))


def test_exhausted_script_answers_500_with_a_json_error() -> None:
    with ScriptedLLM() as llm:
        reply = httpx.post(f"{llm.base_url}/chat/completions", json={"model": "m"})

    assert reply.status_code == 500
    assert reply.json()["error"]["message"] == EXHAUSTED_MESSAGE


def test_error_status_carries_the_text_and_headers() -> None:
    with ScriptedLLM([Reply(status=429, text="too fast", headers={"retry-after": "3"})]) as llm:
        reply = httpx.post(f"{llm.base_url}/responses", json={"model": "m"})

    assert reply.status_code == 429
    assert reply.headers["retry-after"] == "3"
    assert reply.json()["error"] == {
        "message": "too fast",
        "type": "rate_limit_error",
        "param": None,
        "code": None,
    }


def test_responder_answers_once_the_queue_is_empty() -> None:
    seen: list[RecordedRequest] = []

    def echo(request: RecordedRequest) -> str:
        seen.append(request)
        return f"echo: {request.last_user_text}"

    with ScriptedLLM(["scripted"], responder=echo) as llm:
        client = sdk(llm)
        texts = [client.responses.create(model="m", input=word).output_text for word in ("a", "b")]
        client.close()

    assert texts == ["scripted", "echo: b"]
    assert [r.last_user_text for r in seen] == ["b"]


def test_a_failing_responder_gives_a_500_not_a_hang() -> None:
    def broken(request: RecordedRequest) -> str:
        raise RuntimeError("nope")

    with ScriptedLLM(responder=broken) as llm:
        reply = httpx.post(f"{llm.base_url}/responses", json={"model": "m"})

    assert reply.status_code == 500
    assert "responder failed: nope" in reply.json()["error"]["message"]


def test_garbage_is_not_json() -> None:
    with ScriptedLLM([Reply(garbage=True)]) as llm:
        reply = httpx.post(f"{llm.base_url}/chat/completions", json={"model": "m"})

    assert reply.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        reply.json()


def test_requests_are_recorded_with_headers() -> None:
    with ScriptedLLM(["ok"]) as llm:
        client = sdk(llm)
        client.chat.completions.create(
            model="gpt-x",
            messages=[
                {"role": "system", "content": "rules"},
                {"role": "user", "content": "question"},
            ],
        )
        client.close()

    [request] = llm.requests
    assert request.api == "chat"
    assert request.model == "gpt-x"
    assert request.stream is False
    assert request.instructions == "rules"
    assert request.all_text == "rules\nquestion"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["content-type"] == "application/json"


def test_unknown_route_is_404_and_consumes_no_reply() -> None:
    with ScriptedLLM(["kept"]) as llm:
        reply = httpx.post(f"{llm.base_url}/embeddings", json={})
        assert llm.pending == 1

    assert reply.status_code == 404
    assert llm.requests == []


def test_concurrent_requests_are_served_in_parallel() -> None:
    """Four requests meet at a barrier inside the server: a serial server would time out."""
    barrier = threading.Barrier(4, timeout=5)

    def meet(request: RecordedRequest) -> str:
        barrier.wait()
        return "met"

    with ScriptedLLM(responder=meet) as llm:
        url = f"{llm.base_url}/chat/completions"
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda _: httpx.post(url, json={"model": "m"}), range(4)))

    assert [r.json()["choices"][0]["message"]["content"] for r in replies] == ["met"] * 4


def test_time_spent_counts_delays() -> None:
    with ScriptedLLM([Reply(text="slow", delay=0.05), "fast"]) as llm:
        for _ in range(2):
            httpx.post(f"{llm.base_url}/responses", json={"model": "m"})

    assert llm.time_spent >= 0.05


def test_stop_does_not_wait_for_a_delayed_reply() -> None:
    llm = ScriptedLLM([Reply(text="never", delay=30)]).start()
    url = f"{llm.base_url}/responses"
    errors: list[Exception] = []

    def call() -> None:
        try:
            httpx.post(url, json={"model": "m"}, timeout=10)
        except httpx.HTTPError as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    while not llm.requests:
        time.sleep(0.005)
    llm.stop()
    caller.join(timeout=5)

    assert not caller.is_alive()


def test_base_url_needs_a_running_server() -> None:
    llm = ScriptedLLM()
    with pytest.raises(RuntimeError):
        _ = llm.base_url
    with llm:
        assert llm.base_url.startswith("http://127.0.0.1:")
        assert llm.base_url.endswith("/v1")


def test_a_client_of_an_earlier_server_on_the_same_port_takes_nothing() -> None:
    """Tests take free ports, so a port comes back: a server of an earlier test still retrying its
    model call on it must not take the replies of the test that now listens there (it took one
    in CI: the next test's turn then found the script exhausted and failed)."""
    with ScriptedLLM(["for the earlier test"]) as earlier:
        stale_url = earlier.base_url
    port = int(stale_url.split(":")[2].split("/")[0])
    with ScriptedLLM(["for this test"], port=port) as llm:
        stale = httpx.post(f"{stale_url}/chat/completions", json={"model": "m", "messages": []})
        assert stale.status_code == 404
        assert llm.requests == []
        reply = openai.OpenAI(base_url=llm.base_url, api_key="x").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == "for this test"
