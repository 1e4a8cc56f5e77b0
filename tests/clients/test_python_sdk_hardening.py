"""The Python SDK (clients/python) against what it must not do: show the API key in a repr, or keep
reading (and buffering) one endless event of a stream from a hostile or broken server."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sabre_api.client import AuthenticatedClient
from sabre_client import MAX_EVENT_BYTES, AsyncSabre, EventTooLarge, Sabre


def test_the_client_repr_never_shows_the_token() -> None:
    client = AuthenticatedClient(base_url="http://127.0.0.1:1", token="sk-secret")
    for shown in (repr(client), str(client)):
        assert "sk-secret" not in shown
        assert "http://127.0.0.1:1" in shown
    # Building the httpx client copies the token into the headers: still hidden.
    client.get_httpx_client()
    client.get_async_httpx_client()
    headed = client.with_headers({"X-Trace": "t1"})
    for shown in (repr(client), str(client), repr(headed), str(headed)):
        assert "sk-secret" not in shown
    with Sabre("http://127.0.0.1:1", api_key="sk-secret") as sabre:
        assert "sk-secret" not in repr(sabre.api)


class EndlessLine(BaseHTTPRequestHandler):
    """Answers any POST like a streamed turn: one event, then a ``data:`` line of twice
    ``MAX_EVENT_BYTES`` that a bounded reader stops reading long before its end."""

    finished: threading.Event
    broken: threading.Event

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("location", "/v1/conversations/conv_1/turns/turn_1")
        self.end_headers()
        try:
            self.wfile.write(f"id: 1\ndata: {json.dumps(FIRST_EVENT)}\n\n".encode())
            self.wfile.write(b'data: "')
            chunk = b"x" * 65536
            for _ in range(2 * MAX_EVENT_BYTES // len(chunk)):
                self.wfile.write(chunk)
            self.wfile.write(b'"\n\n')
            self.wfile.flush()
        except OSError:  # the client hung up mid-line
            self.broken.set()
        finally:
            self.finished.set()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


FIRST_EVENT = {
    "id": "evt_1",
    "seq": 1,
    "turn_id": "turn_1",
    "parent_id": None,
    "type": "turn.started",
    "created_at": "2025-01-01T00:00:00Z",
    "data": {},
}


@pytest.fixture
def endless() -> Iterator[tuple[str, type[EndlessLine]]]:
    """The URL of a server answering with an endless SSE line, and its handler (its events)."""
    handler = type("Handler", (EndlessLine,), {"finished": threading.Event(), "broken": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_an_oversized_event_fails_the_stream(endless: tuple[str, type[EndlessLine]]) -> None:
    url, handler = endless
    with Sabre(url, api_key="k") as sabre:
        stream = sabre.stream_conversation("hi")
        events = iter(stream)
        assert next(events).seq == 1
        with pytest.raises(EventTooLarge, match=str(MAX_EVENT_BYTES)):
            next(events)
    assert stream.state.resumes == 0
    # The client hung up mid-line instead of reading (and keeping) the rest.
    assert handler.finished.wait(30)
    assert handler.broken.is_set()


async def test_an_oversized_event_fails_the_async_stream(endless: tuple[str, type[EndlessLine]]) -> None:
    url, handler = endless
    async with AsyncSabre(url, api_key="k") as sabre:
        stream = sabre.stream_conversation("hi")
        events = aiter(stream)
        assert (await anext(events)).seq == 1
        with pytest.raises(EventTooLarge, match=str(MAX_EVENT_BYTES)):
            await anext(events)
    assert stream.state.resumes == 0
    assert await asyncio.to_thread(handler.finished.wait, 30)
    assert handler.broken.is_set()
