"""A scripted OpenAI-compatible server: real HTTP on loopback, replies laid out by a test.

Tests (and benchmarks) point the real clients, and through them the real `openai` SDK, at this
server instead of a model. It serves `POST /v1/chat/completions` and `POST /v1/responses`, streamed
(server-sent events in exactly the shapes the SDK parses) or not, records every request, and answers
with the scripted replies in order, whichever endpoint asks.

It runs a `ThreadingHTTPServer` in a background thread, so it works the same from sync tests and
from async tests (it never touches their event loop) and serves concurrent requests. A stream goes
out in one write unless a reply paces it (`chunk_delay`), and `time_spent` adds up the time spent
answering, so benchmarks can subtract the model's share. Sharing the process (and its GIL) with the
code under test costs about 1 ms a call; a benchmark that minds can run it as a separate process.

    with ScriptedLLM(["Hello!", Reply(status=500), "<helpers>print(1)</helpers>"]) as llm:
        client = make_llm_client(api="chat", base_url=llm.base_url, api_key=None)
        ...
        assert llm.requests[0].last_user_text == "hi"

Run it on its own with `python -m app.llm.scripted --port 8999 --reply "Hello"`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final, Literal, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

CHAT_PATH: Final = "/v1/chat/completions"
RESPONSES_PATH: Final = "/v1/responses"
EXHAUSTED_MESSAGE: Final = "scripted LLM: script exhausted"
_HANG_UP: Final = b""
"""Yielded by an event generator to make the handler drop the connection mid-stream."""
GARBAGE_BODY: Final = b"<html><body>502 Bad Gateway</body></html>\ndata: {this is not json\n\n"

ScriptedApi = Literal["chat", "responses"]


class ScriptedToolCall(BaseModel):
    """One function call a reply asks for (Chat Completions ``tool_calls``), the way a function-calling
    agent's model asks (SABRE's own model asks by writing code; the LangGraph bench build does not)."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Reply(BaseModel):
    """One scripted reply.

    A `status` other than 200 answers with an OpenAI-style JSON error body (whose message is `text`
    when given); `garbage` answers 200 with a body that is neither JSON nor valid events; `delay`
    waits before answering (the client's timeout can be tested with it). Token counts default to
    characters // 4 of the prompt and of the text sent. `ignore_stop` behaves like the many local
    servers that do not implement chat `stop`; `disconnect_after` drops the connection after that
    many streamed text chunks, like a server dying mid-generation. A stream is written in one go
    (fastest, for benchmarks) unless `chunk_delay` paces its events like a model generating.
    `tool_calls` makes the assistant message ask for those function calls (finish reason
    `tool_calls`; chat completions only: the responses API answers 400).
    """

    text: str = ""
    status: int = 200
    garbage: bool = False
    delay: float = 0.0
    input_tokens: int | None = None
    output_tokens: int | None = None
    chunk_size: int = Field(default=16, ge=1)
    chunk_delay: float = Field(default=0.0, ge=0)
    """Seconds between streamed events; 0 sends the whole stream at once."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra response headers, e.g. `{"retry-after": "0.01"}` on a 429."""
    ignore_stop: bool = False
    disconnect_after: int | None = Field(default=None, ge=0)
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)


@dataclass(frozen=True)
class RecordedMessage:
    """One input message, the same shape whichever API carried it."""

    role: str
    text: str
    images: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RecordedRequest:
    """A request as the server received it, with views that read the same across both APIs."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    """Header names in lower case."""

    @property
    def api(self) -> ScriptedApi:
        return "responses" if self.path == RESPONSES_PATH else "chat"

    @property
    def model(self) -> str | None:
        model = self.body.get("model")
        return model if isinstance(model, str) else None

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    @property
    def instructions(self) -> str:
        """Responses `instructions`, or the leading system/developer messages of a chat request."""
        if self.api == "responses":
            value = self.body.get("instructions")
            return value if isinstance(value, str) else ""
        leading: list[str] = []
        for message in _chat_messages(self.body):
            if message.role not in ("system", "developer"):
                break
            leading.append(message.text)
        return "\n".join(leading)

    @property
    def messages(self) -> list[RecordedMessage]:
        """The conversation sent, without the instructions."""
        if self.api == "responses":
            return _responses_messages(self.body)
        messages = _chat_messages(self.body)
        skip = 0
        while skip < len(messages) and messages[skip].role in ("system", "developer"):
            skip += 1
        return messages[skip:]

    @property
    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.role == "user":
                return message.text
        return ""

    @property
    def all_text(self) -> str:
        """Instructions and every message's text, one per line: handy for `in` assertions."""
        texts = [self.instructions] if self.instructions else []
        texts.extend(message.text for message in self.messages)
        return "\n".join(texts)

    @property
    def stop(self) -> list[str]:
        """The chat request's stop strings (a single string is normalised to a list)."""
        stop = self.body.get("stop")
        if isinstance(stop, str):
            return [stop]
        if isinstance(stop, list):
            return [s for s in stop if isinstance(s, str) and s]
        return []


Responder = Callable[[RecordedRequest], str | Reply]


class ScriptedLLM:
    """The scripted server: one FIFO of replies for both endpoints, then `responder`, then 500."""

    def __init__(
        self,
        replies: Iterable[str | Reply] = (),
        *,
        responder: Responder | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        private_path: bool = True,
    ) -> None:
        """``private_path``: serve under a path of this instance's own (``/s<hex>/v1``), so that a
        client of an earlier server that had this port (a test's server still retrying its model
        call) is refused with a 404 instead of taking this server's replies."""
        self.prefix = f"/s{secrets.token_hex(4)}" if private_path else ""
        self._queue: collections.deque[Reply] = collections.deque(_as_reply(r) for r in replies)
        self._responder = responder
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.requests: list[RecordedRequest] = []
        """Every request received, in arrival order."""
        self.time_spent = 0.0
        """Seconds spent producing replies (delays included), for benchmarks to subtract."""

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT/s<hex>/v1` (`…:PORT/v1` without a private path), what a client
        takes as its base URL."""
        if self._server is None:
            raise RuntimeError("ScriptedLLM is not running: call start() or use it as a context")
        return f"http://{self._host}:{self._server.server_address[1]}{self.prefix}/v1"

    def script(self, *replies: str | Reply) -> None:
        """Append replies to the queue."""
        with self._lock:
            self._queue.extend(_as_reply(r) for r in replies)

    @property
    def pending(self) -> int:
        """Scripted replies not served yet."""
        with self._lock:
            return len(self._queue)

    def start(self) -> Self:
        """Bind a port (a free one unless given) and serve in a daemon thread."""
        if self._server is not None:
            return self
        self._stopping.clear()
        server = _Server((self._host, self._port), self)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.02},  # how quickly stop() is noticed
            name=f"scripted-llm-{server.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and drop open connections, so no client is left waiting."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.close_connections()
        server.server_close()
        if thread is not None:
            thread.join()
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # Called from the handler threads.

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _next_reply(self, request: RecordedRequest) -> Reply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self._responder is None:
            return Reply(status=500, text=EXHAUSTED_MESSAGE)
        try:
            return _as_reply(self._responder(request))
        except Exception as exc:  # a broken responder must fail the call, not hang the client
            return Reply(status=500, text=f"scripted LLM: responder failed: {exc}")

    def _add_time(self, seconds: float) -> None:
        with self._lock:
            self.time_spent += seconds

    def _wait(self, seconds: float) -> None:
        """Sleep, but wake up when the server stops."""
        self._stopping.wait(seconds)


class _Server(ThreadingHTTPServer):
    """Threading server that tracks its connections so that stop() can cut them."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], owner: ScriptedLLM) -> None:
        super().__init__(address, _Handler)
        self.owner = owner
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        # Headers and body (or paced events) are separate writes: Nagle + delayed ACK add ~40 ms.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._connections_lock:
            self._connections.add(sock)
        return sock, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about clients hanging up (normal after a cut at </helpers>); loud otherwise."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    """Speaks just enough HTTP/1.1 (keep-alive, chunked streaming) for the openai SDK."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests do not want an access log on stderr."""

    def _route(self) -> str | None:
        """The request's path below this server's own prefix; None (a 404 sent) when it is not
        under it: a stale client of an earlier server on this port, which must take nothing."""
        path = urlsplit(self.path).path
        prefix = self.server.owner.prefix
        if not path.startswith(prefix + "/"):
            self._send_error(
                404, f"scripted LLM: {path} is not under this server's {prefix}/", "not_found_error"
            )
            return None
        return path[len(prefix) :]

    def do_GET(self) -> None:
        path = self._route()
        if path is None:
            return
        if path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
        else:
            self._send_error(404, f"scripted LLM: no route GET {self.path}", "not_found_error")

    def do_POST(self) -> None:
        raw = self._read_body()
        path = self._route()
        if path is None:
            return
        if path not in (CHAT_PATH, RESPONSES_PATH):
            self._send_error(404, f"scripted LLM: no route POST {path}", "not_found_error")
            return
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self.server.owner._record(RecordedRequest(path, {}, self._header_dict()))
            self._send_error(400, "scripted LLM: the request body is not a JSON object")
            return
        request = RecordedRequest(path, body, self._header_dict())
        owner = self.server.owner
        owner._record(request)
        reply = owner._next_reply(request)
        started = time.perf_counter()
        try:
            if reply.delay > 0:
                owner._wait(reply.delay)
            self._answer(request, reply)
        except (BrokenPipeError, ConnectionResetError):
            # The client hung up, typically after it cut the stream at </helpers>.
            self.close_connection = True
        finally:
            owner._add_time(time.perf_counter() - started)

    # Replies.

    def _answer(self, request: RecordedRequest, reply: Reply) -> None:
        if reply.status != 200:
            message = reply.text or f"scripted LLM: HTTP {reply.status}"
            self._send_error(reply.status, message, _error_type(reply.status), reply.headers)
            return
        if reply.garbage:
            content_type = "text/event-stream" if request.stream else "application/json"
            self._send_bytes(200, GARBAGE_BODY, content_type, reply.headers)
            return
        if reply.tool_calls and request.api != "chat":
            self._send_error(400, "scripted LLM: tool-call replies are served on chat completions only")
            return
        text = reply.text
        if request.api == "chat" and not reply.ignore_stop:
            text = _cut_at_stop(text, request.stop)
        calls = _wire_calls(reply.tool_calls)
        usage = _Usage(
            input_tokens=(
                reply.input_tokens if reply.input_tokens is not None else len(request.all_text) // 4
            ),
            output_tokens=(
                reply.output_tokens
                if reply.output_tokens is not None
                else (len(text) + len(json.dumps(calls) if calls else "")) // 4
            ),
        )
        model = request.model or "scripted"
        if request.api == "chat":
            if request.stream:
                include_usage = _include_usage(request.body)
                events = _chat_events(
                    text,
                    calls,
                    model=model,
                    usage=usage if include_usage else None,
                    chunk_size=reply.chunk_size,
                    disconnect_after=reply.disconnect_after,
                )
                self._send_stream(events, reply)
            else:
                self._send_json(200, _chat_completion(text, calls, model=model, usage=usage), reply.headers)
        elif request.stream:
            events = _responses_events(
                text,
                model=model,
                usage=usage,
                chunk_size=reply.chunk_size,
                instructions=request.body.get("instructions"),
                disconnect_after=reply.disconnect_after,
            )
            self._send_stream(events, reply)
        else:
            response = _response_object(
                text,
                model=model,
                usage=usage,
                status="completed",
                instructions=request.body.get("instructions"),
                message_id=_new_id("msg"),
            )
            self._send_json(200, response, reply.headers)

    # HTTP plumbing.

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(data)
                data.extend(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _header_dict(self) -> dict[str, str]:
        return {name.lower(): value for name, value in self.headers.items()}

    def _send_error(
        self,
        status: int,
        message: str,
        error_type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        body = {"error": {"message": message, "type": error_type, "param": None, "code": None}}
        self._send_json(status, body, headers)

    def _send_json(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
        self._send_bytes(status, json.dumps(body).encode(), "application/json", headers)

    def _send_bytes(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, events: Iterator[bytes], reply: Reply) -> None:
        """Server-sent events in a chunked body, batched into one write unless paced."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        pending = bytearray()
        for event in events:
            if event == _HANG_UP:
                # No terminating chunk: the client sees an incomplete body, as when a server dies.
                self.wfile.write(pending)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            pending += b"%x\r\n%s\r\n" % (len(event), event)
            if reply.chunk_delay > 0:
                self.wfile.write(pending)
                pending.clear()
                self.server.owner._wait(reply.chunk_delay)
        pending += b"0\r\n\r\n"
        self.wfile.write(pending)


# Wire shapes.


@dataclass(frozen=True)
class _Usage:
    input_tokens: int
    output_tokens: int


def _sse(data: object, *, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _chunks(text: str, size: int) -> list[str]:
    return [text[start : start + size] for start in range(0, len(text), size)]


def _wire_calls(calls: list[ScriptedToolCall]) -> list[dict[str, Any]]:
    """Chat Completions ``tool_calls`` (with the ``index`` a streamed delta carries)."""
    return [
        {
            "index": index,
            "id": _new_id("call"),
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for index, call in enumerate(calls)
    ]


def _chat_events(
    text: str,
    calls: list[dict[str, Any]],
    *,
    model: str,
    usage: _Usage | None,
    chunk_size: int,
    disconnect_after: int | None,
) -> Iterator[bytes]:
    """Chat Completions chunks: role, content pieces, tool calls, finish reason, usage (if asked),
    [DONE]."""
    base = {
        "id": _new_id("chatcmpl"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
    }

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse({**base, "choices": [choice], "usage": None})

    yield chunk({"role": "assistant", "content": ""}, None)
    pieces = _chunks(text, chunk_size)
    for piece in pieces[:disconnect_after]:
        yield chunk({"content": piece}, None)
    if disconnect_after is not None:
        yield _HANG_UP
        return
    if calls:
        yield chunk({"tool_calls": calls}, None)
    yield chunk({}, "tool_calls" if calls else "stop")
    if usage is not None:
        yield _sse({**base, "choices": [], "usage": _chat_usage(usage)})
    yield b"data: [DONE]\n\n"


def _chat_completion(text: str, calls: list[dict[str, Any]], *, model: str, usage: _Usage) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["content"] = text or None
        message["tool_calls"] = [{k: v for k, v in call.items() if k != "index"} for call in calls]
    finish = "tool_calls" if calls else "stop"
    return {
        "id": _new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": _chat_usage(usage),
    }


def _chat_usage(usage: _Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def _responses_events(
    text: str,
    *,
    model: str,
    usage: _Usage,
    chunk_size: int,
    instructions: object,
    disconnect_after: int | None,
) -> Iterator[bytes]:
    """The Responses event sequence OpenAI sends for one text message, ending in completed."""
    response_id, message_id = _new_id("resp"), _new_id("msg")
    sequence = iter(range(1_000_000))

    def event(kind: str, **fields: Any) -> bytes:
        return _sse({"type": kind, "sequence_number": next(sequence), **fields}, event=kind)

    def response(status: str, *, final_text: str | None) -> dict[str, Any]:
        return _response_object(
            final_text,
            model=model,
            usage=usage if final_text is not None else None,
            status=status,
            instructions=instructions,
            message_id=message_id,
            response_id=response_id,
        )

    empty_part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    done_part = {**empty_part, "text": text}
    where = {"item_id": message_id, "output_index": 0, "content_index": 0}
    item = {"id": message_id, "type": "message", "role": "assistant"}

    yield event("response.created", response=response("in_progress", final_text=None))
    yield event("response.in_progress", response=response("in_progress", final_text=None))
    yield event(
        "response.output_item.added",
        output_index=0,
        item={**item, "status": "in_progress", "content": []},
    )
    yield event("response.content_part.added", part=empty_part, **where)
    pieces = _chunks(text, chunk_size)
    for piece in pieces[:disconnect_after]:
        yield event("response.output_text.delta", delta=piece, logprobs=[], **where)
    if disconnect_after is not None:
        yield _HANG_UP
        return
    yield event("response.output_text.done", text=text, logprobs=[], **where)
    yield event("response.content_part.done", part=done_part, **where)
    yield event(
        "response.output_item.done",
        output_index=0,
        item={**item, "status": "completed", "content": [done_part]},
    )
    yield event("response.completed", response=response("completed", final_text=text))


def _response_object(
    text: str | None,
    *,
    model: str,
    usage: _Usage | None,
    status: str,
    instructions: object,
    message_id: str,
    response_id: str | None = None,
) -> dict[str, Any]:
    """A Responses `Response` object; `text=None` means no output yet."""
    output: list[dict[str, Any]] = []
    if text is not None:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        output.append(
            {
                "id": message_id,
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    return {
        "id": response_id or _new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": instructions if isinstance(instructions, str) else None,
        "max_output_tokens": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": None if usage is None else _responses_usage(usage),
        "user": None,
        "metadata": {},
    }


def _responses_usage(usage: _Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


# Request parsing.


def _chat_messages(body: dict[str, Any]) -> list[RecordedMessage]:
    raw = body.get("messages")
    if not isinstance(raw, list):
        return []
    return [_message(item) for item in raw if isinstance(item, dict)]


def _responses_messages(body: dict[str, Any]) -> list[RecordedMessage]:
    raw = body.get("input")
    if isinstance(raw, str):
        return [RecordedMessage(role="user", text=raw)]
    if not isinstance(raw, list):
        return []
    return [
        _message(item) for item in raw if isinstance(item, dict) and item.get("type", "message") == "message"
    ]


def _message(item: dict[str, Any]) -> RecordedMessage:
    """A message of either API: content is a string or a list of text and image parts."""
    role = str(item.get("role", ""))
    content = item.get("content")
    if isinstance(content, str):
        return RecordedMessage(role=role, text=content)
    texts: list[str] = []
    images: list[str] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            images.append(part["image_url"])
        elif kind == "image_url" and isinstance(part.get("image_url"), dict):
            url = part["image_url"].get("url")
            if isinstance(url, str):
                images.append(url)
    return RecordedMessage(role=role, text="\n".join(texts), images=images)


def _cut_at_stop(text: str, stop: list[str]) -> str:
    """What a real server does with `stop`: end before the earliest stop string, dropping it."""
    cut = min((at for at in (text.find(s) for s in stop) if at >= 0), default=-1)
    return text if cut < 0 else text[:cut]


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _error_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _as_reply(reply: str | Reply) -> Reply:
    return Reply(text=reply) if isinstance(reply, str) else reply


def _constant(text: str) -> Responder:
    def respond(_: RecordedRequest) -> str:
        return text

    return respond


def main(argv: list[str] | None = None) -> None:
    """Serve scripted replies until interrupted (for trying the service by hand)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8999)
    parser.add_argument("--reply", action="append", default=[], help="a reply, served in order (repeatable)")
    parser.add_argument(
        "--default", dest="default_reply", default=None, help="the reply once the script is used up"
    )
    args = parser.parse_args(argv)
    default_reply: str | None = args.default_reply
    responder = None if default_reply is None else _constant(default_reply)
    server = ScriptedLLM(args.reply, responder=responder, host=args.host, port=args.port, private_path=False)
    with server:
        print(f"scripted LLM serving at {server.base_url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
