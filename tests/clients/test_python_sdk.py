"""The Python SDK (clients/python) against a live ``sabre serve``: generated code in step with the
spec; create, pause on an external tool, resume with results; streamed turns, resumed after a dropped
connection; errors as typed exceptions carrying the problem's code; async too."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from sabre_api.models import ToolError
from sabre_client import (
    AsyncSabre,
    AuthenticationError,
    ConflictError,
    ConnectionFailed,
    NotFoundError,
    PreconditionFailedError,
    Sabre,
    UnprocessableError,
)

from tests.clients.conftest import API_KEY
from tests.live_server import ROOT, free_port

ORDER_TOOL = {
    "type": "function",
    "name": "get_order",
    "description": "Look up an order.",
    "parameters": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    },
}


@pytest.fixture
def sabre(live_url: str) -> Iterator[Sabre]:
    with Sabre(live_url, api_key=API_KEY) as client:
        yield client


def test_the_generated_code_matches_the_spec() -> None:
    done = subprocess.run(
        [sys.executable, "clients/generate.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_create_pause_resume_with_results(sabre: Sabre) -> None:
    turn = sabre.create_conversation("tool: where is A1?", tools=[ORDER_TOOL], metadata={"case": "sdk"})
    assert turn.status == "awaiting_tool_results"
    (call,) = turn.pending_tool_calls
    assert call.name == "get_order"
    assert call.arguments.to_dict() == {"order_id": "A1"}
    resumed = sabre.submit_tool_results(
        turn.conversation_id, {call.id: {"status": "shipped"}}, if_match=turn.version
    )
    assert resumed.status == "completed"
    assert resumed.output == "The block printed: {'status': 'shipped'}"
    # An error answer is raised in the code; the transcript shows both results' parts typed by kind.
    again = sabre.send_message(turn.conversation_id, "tool: and again?")
    failed = sabre.submit_tool_results(
        again.conversation_id, [ToolError(tool_call_id=again.pending_tool_calls[0].id, error="no such order")]
    )
    assert failed.status == "completed"
    kinds = [part.kind for message in sabre.messages(turn.conversation_id) for part in message.parts]
    assert kinds.count("tool_result") == 2
    assert "helpers" in kinds
    state = sabre.get_conversation(turn.conversation_id)
    assert state.status == "idle"
    assert state.metadata.to_dict() == {"case": "sdk"}


def test_a_streamed_turn_yields_typed_events_and_its_end(sabre: Sabre) -> None:
    stream = sabre.stream_conversation("code: add up")
    events = list(stream)
    types = [event.type_ for event in events]
    assert types[0] == "turn.started"
    assert types[-1] == "turn.completed"
    assert {"llm.delta", "block.started", "block.completed"} <= set(types)
    seqs = [event.seq for event in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert stream.turn is not None
    assert stream.turn.output == "The block printed: 45"
    assert stream.state.resumes == 0


class DropOnce(httpx.HTTPTransport):
    """Cuts the first streamed POST after a few chunks, as a network would."""

    def __init__(self, *, after_chunks: int) -> None:
        super().__init__()
        self.after_chunks = after_chunks
        self.dropped = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if (
            request.method != "POST"
            or self.dropped
            or "event-stream" not in response.headers.get("content-type", "")
        ):
            return response
        self.dropped += 1
        upstream = response.stream
        limit = self.after_chunks

        class Cut(httpx.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                for index, chunk in enumerate(upstream):  # type: ignore[union-attr]
                    if index >= limit:
                        raise httpx.ReadError("connection reset by peer")
                    yield chunk

            def close(self) -> None:
                upstream.close()  # type: ignore[union-attr]

        return httpx.Response(response.status_code, headers=response.headers, stream=Cut(), request=request)


def test_a_dropped_stream_resumes_from_the_last_event_id(live_url: str) -> None:
    transport = DropOnce(after_chunks=3)
    with Sabre(live_url, api_key=API_KEY) as sabre:
        sabre.api.set_httpx_client(
            httpx.Client(
                base_url=live_url,
                transport=transport,
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=60,
            )
        )
        stream = sabre.stream_conversation("slow: tell me")
        events = list(stream)
    assert transport.dropped == 1
    assert stream.state.resumes == 1
    seqs = [event.seq for event in events]
    # Every event once, in order, from turn.started to the end: nothing lost or repeated at the cut.
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert events[0].type_ == "turn.started"
    assert events[-1].type_ == "turn.completed"
    assert stream.turn is not None
    assert stream.turn.output == "This answer streams slowly, word by word."


def test_errors_are_typed_with_the_problem_code(sabre: Sabre, live_url: str) -> None:
    with Sabre(live_url, api_key="sk-wrong") as stranger, pytest.raises(AuthenticationError) as denied:
        stranger.personas()
    assert denied.value.code == "unauthorized"
    assert denied.value.status_code == 401

    with pytest.raises(NotFoundError) as missing:
        sabre.get_conversation("conv_nope")
    assert missing.value.code == "not_found"

    paused = sabre.create_conversation("tool: A1?", tools=[ORDER_TOOL])
    with pytest.raises(ConflictError) as busy:
        sabre.send_message(paused.conversation_id, "hello?")
    assert busy.value.code == "awaiting_tool_results"

    with pytest.raises(PreconditionFailedError) as stale:
        sabre.submit_tool_results(paused.conversation_id, {"x": 1}, if_match=paused.version + 3)
    assert stale.value.current == {"version": paused.version}

    with pytest.raises(UnprocessableError) as wrong:
        sabre.submit_tool_results(paused.conversation_id, {"call_unknown": 1})
    assert wrong.value.code == "tool_call_ids_mismatch"
    assert wrong.value.expected_tool_call_ids == [paused.pending_tool_calls[0].id]
    assert wrong.value.problem is not None

    with pytest.raises(ConflictError):
        list(sabre.stream_message(paused.conversation_id, "streamed?"))


def test_a_server_that_is_down_is_a_connection_error() -> None:
    with Sabre(f"http://127.0.0.1:{free_port()}", api_key="k") as sabre, pytest.raises(ConnectionFailed):
        sabre.personas()
    with Sabre(f"http://127.0.0.1:{free_port()}", api_key="k") as sabre, pytest.raises(ConnectionFailed):
        list(sabre.stream_conversation("hi"))


async def test_the_async_client(live_url: str) -> None:
    async with AsyncSabre(live_url, api_key=API_KEY) as sabre:
        assert "default" in [persona.name for persona in await sabre.personas()]
        stream = sabre.stream_conversation("plot: a line")
        types = [event.type_ async for event in stream]
        assert types[-1] == "turn.completed"
        turn = stream.turn
        assert turn is not None
        parts = [part async for message in sabre.messages(turn.conversation_id) for part in message.parts]
        figures = [file_id for part in parts if part.kind == "helpers_result" for file_id in part.files]
        assert len(figures) == 1
        png = await sabre.file(figures[0])
        assert png.startswith(b"\x89PNG")
        paused = await sabre.create_conversation("tool: A1?", tools=[ORDER_TOOL])
        call = paused.pending_tool_calls[0]
        resumed = await sabre.stream_tool_results(paused.conversation_id, {call.id: "shipped"}).until_done()
        assert resumed.status == "completed"
        await sabre.delete_conversation(paused.conversation_id)
        with pytest.raises(NotFoundError):
            await sabre.get_conversation(paused.conversation_id)
