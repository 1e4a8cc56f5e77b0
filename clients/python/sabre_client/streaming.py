"""A turn's events over SSE, resumed from the last event id when the connection breaks.

A streamed POST answers with the turn's events (its ``Location`` names the conversation and the
turn). If the connection drops before the turn's end event, the stream goes on from
``GET /v1/conversations/{id}/events`` with ``Last-Event-ID``: the server replays what was stored
after that event and follows the turn live, so no event is lost or repeated.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from httpx_sse import EventSource, ServerSentEvent, SSEError, aconnect_sse, connect_sse
from sabre_api.models.event_out import EventOut
from sabre_api.models.turn_out import TurnOut

from sabre_client.errors import ConnectionFailed, EventTooLarge, StreamInterrupted, error_for

END_TYPES: Final = frozenset(
    {"turn.completed", "turn.awaiting_tool_results", "turn.failed", "turn.cancelled"}
)
SSE_HEADERS: Final = {"Accept": "text/event-stream"}
BROKEN: Final = (httpx.TransportError, httpx.StreamError)
MAX_EVENT_BYTES: Final = 16 * 1024 * 1024
"""The most one event of a stream may hold, its lines as sent: past it the stream fails with
``EventTooLarge`` instead of buffering whatever a broken or hostile server keeps sending."""

LINE_END: Final = re.compile(rb"\r\n?|\n")


class EventDecoder:
    """Server-sent events from the bytes of a stream, each at most ``limit`` bytes.

    httpx_sse buffers a line however long it grows; this counts an event's bytes as they arrive (the
    line not yet ended included) and raises ``EventTooLarge`` once past ``limit``, so at most
    ``limit`` and one chunk are held. Fields are read as the SSE specification says; an event
    unfinished when the stream ends is dropped.
    """

    def __init__(self, url: str, limit: int = MAX_EVENT_BYTES) -> None:
        self.url = url
        self.limit = limit
        self._line = bytearray()  # the line not yet ended
        self._size = 0  # bytes of the current event's ended lines
        self._cr_ended = False  # the last chunk ended with \r: a \n first in the next is the same end
        self._event = ""
        self._data: list[str] = []
        self._id = ""
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """The events that ``chunk`` completes."""
        start = 1 if self._cr_ended and chunk[:1] == b"\n" else 0
        self._cr_ended = False
        events: list[ServerSentEvent] = []
        for end in LINE_END.finditer(chunk, start):
            self._line += chunk[start : end.start()]
            start = end.end()
            self._cr_ended = end.group() == b"\r" and start == len(chunk)
            event = self._take_line()
            if event is not None:
                events.append(event)
        self._line += chunk[start:]
        if self._size + len(self._line) > self.limit:
            raise EventTooLarge(self.limit, url=self.url)
        return events

    def _take_line(self) -> ServerSentEvent | None:
        if not self._line:
            return self._dispatch()
        line = self._line.decode("utf-8", errors="replace")
        self._size += len(self._line) + 1
        self._line.clear()
        if self._size > self.limit:
            raise EventTooLarge(self.limit, url=self.url)
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        self._size = 0
        if not self._data:
            self._event, self._retry = "", None
            return None
        event = ServerSentEvent(event=self._event, data="\n".join(self._data), id=self._id, retry=self._retry)
        self._event, self._data, self._retry = "", [], None  # the last event id is kept (the spec)
        return event


def _event_stream(source: EventSource) -> httpx.Response:
    """The answer of ``source`` if it is an event stream (as httpx_sse checks it)."""
    content_type = source.response.headers.get("content-type", "").partition(";")[0]
    if "text/event-stream" not in content_type:
        raise SSEError(f"expected an event stream (text/event-stream), got {content_type!r}")
    return source.response


def iter_events(source: EventSource, url: str, limit: int = MAX_EVENT_BYTES) -> Iterator[ServerSentEvent]:
    """The events of an SSE answer, each at most ``limit`` bytes (``EventTooLarge`` past it)."""
    decoder = EventDecoder(url, limit)
    for chunk in _event_stream(source).iter_bytes():
        yield from decoder.feed(chunk)


async def aiter_events(
    source: EventSource, url: str, limit: int = MAX_EVENT_BYTES
) -> AsyncGenerator[ServerSentEvent, None]:
    """``iter_events`` for an async answer."""
    decoder = EventDecoder(url, limit)
    async for chunk in _event_stream(source).aiter_bytes():
        for event in decoder.feed(chunk):
            yield event


@dataclass
class StreamState:
    """Where a stream is: which turn, the last event received, and the turn once it has ended."""

    conversation_id: str | None = None
    turn_id: str | None = None
    last_event_id: str | None = None
    turn: TurnOut | None = None
    resumes: int = 0
    seen: set[int] = field(default_factory=set)

    def take_location(self, response: httpx.Response) -> None:
        """Read the conversation and turn from the answer's ``Location`` (…/conversations/C/turns/T)."""
        parts = response.headers.get("location", "").strip("/").split("/")
        if len(parts) >= 5 and parts[-4] == "conversations" and parts[-2] == "turns":
            self.conversation_id, self.turn_id = parts[-3], parts[-1]

    def accept(self, sse: ServerSentEvent) -> EventOut | None:
        """The event, or None for one to skip (another turn's, or one already delivered)."""
        event = EventOut.from_dict(json.loads(sse.data))
        if self.turn_id is not None and event.turn_id != self.turn_id:
            return None
        if event.seq in self.seen:
            return None
        self.seen.add(event.seq)
        self.turn_id = event.turn_id
        self.last_event_id = sse.id or str(event.seq)
        if event.type_ in END_TYPES:
            self.turn = TurnOut.from_dict(event.data.to_dict())
        return event

    def resume_request(self) -> tuple[str, dict[str, str], dict[str, Any]]:
        """The GET that continues the stream: path, headers and query."""
        if self.conversation_id is None:
            raise StreamInterrupted("the stream broke before the server named the turn", url="")
        headers = dict(SSE_HEADERS)
        params: dict[str, Any] = {}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        return f"/v1/conversations/{self.conversation_id}/events", headers, params


def _backoff(attempt: int) -> float:
    return float(min(0.2 * 2**attempt, 3.0))


def _check(response: httpx.Response) -> None:
    if response.status_code >= 400:
        response.read()
        raise error_for(response.status_code, response.content, response.headers)


async def _acheck(response: httpx.Response) -> None:
    if response.status_code >= 400:
        await response.aread()
        raise error_for(response.status_code, response.content, response.headers)


class TurnStream:
    """Iterate a turn's events (``EventOut``); ``turn`` is the ended turn once the stream is done.

    Opened by ``Sabre.stream_*``; resumes up to ``max_resumes`` times on a broken connection.
    """

    def __init__(
        self,
        http: httpx.Client,
        *,
        method: str,
        url: str,
        json_body: dict[str, Any] | None,
        headers: dict[str, str],
        max_resumes: int = 5,
    ) -> None:
        self._http = http
        self._first: tuple[str, str, dict[str, Any] | None, dict[str, str]] = (
            method,
            url,
            json_body,
            headers,
        )
        self.max_resumes = max_resumes
        self.state = StreamState()

    @property
    def turn(self) -> TurnOut | None:
        """The turn as it ended (None until the end event has been read)."""
        return self.state.turn

    def __iter__(self) -> Iterator[EventOut]:
        method, url, body, headers = self._first
        attempt = 0
        request: tuple[str, str, dict[str, str], dict[str, Any], dict[str, Any] | None] = (
            method, url, {**SSE_HEADERS, **headers}, {}, body,
        )  # fmt: skip
        while True:
            verb, path, request_headers, params, json_body = request
            try:
                with connect_sse(
                    self._http, verb, path, headers=request_headers, params=params, json=json_body
                ) as source:
                    _check(source.response)
                    if self.state.conversation_id is None:
                        self.state.take_location(source.response)
                    for sse in iter_events(source, str(self._http.base_url)):
                        if not sse.data:
                            continue
                        event = self.state.accept(sse)
                        if event is not None:
                            attempt = 0
                            yield event
                            if self.state.turn is not None:
                                return
            except BROKEN as exc:
                if self.state.conversation_id is None:
                    raise ConnectionFailed(
                        f"cannot reach {self._http.base_url}: {exc}", url=str(self._http.base_url)
                    ) from exc
            if self.state.turn is not None:
                return
            # Ended or broke before the end event: go on from the last event received.
            if attempt >= self.max_resumes:
                raise StreamInterrupted(
                    f"the event stream broke {attempt + 1} times; last event {self.state.last_event_id}",
                    url=str(self._http.base_url),
                )
            time.sleep(_backoff(attempt))
            attempt += 1
            self.state.resumes += 1
            path, resume_headers, params = self.state.resume_request()
            request = ("GET", path, resume_headers, params, None)

    def until_done(self) -> TurnOut:
        """Read the stream to its end; the ended turn."""
        for _ in self:
            pass
        if self.state.turn is None:
            raise StreamInterrupted(
                "the stream ended without the turn's end event", url=str(self._http.base_url)
            )
        return self.state.turn


class AsyncTurnStream:
    """``TurnStream`` for ``AsyncSabre``: ``async for event in stream``."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        method: str,
        url: str,
        json_body: dict[str, Any] | None,
        headers: dict[str, str],
        max_resumes: int = 5,
    ) -> None:
        self._http = http
        self._first: tuple[str, str, dict[str, Any] | None, dict[str, str]] = (
            method,
            url,
            json_body,
            headers,
        )
        self.max_resumes = max_resumes
        self.state = StreamState()

    @property
    def turn(self) -> TurnOut | None:
        """The turn as it ended (None until the end event has been read)."""
        return self.state.turn

    async def __aiter__(self) -> AsyncIterator[EventOut]:
        method, url, body, headers = self._first
        attempt = 0
        request: tuple[str, str, dict[str, str], dict[str, Any], dict[str, Any] | None] = (
            method, url, {**SSE_HEADERS, **headers}, {}, body,
        )  # fmt: skip
        while True:
            verb, path, request_headers, params, json_body = request
            try:
                async with aconnect_sse(
                    self._http, verb, path, headers=request_headers, params=params, json=json_body
                ) as source:
                    await _acheck(source.response)
                    if self.state.conversation_id is None:
                        self.state.take_location(source.response)
                    async with aclosing(aiter_events(source, str(self._http.base_url))) as events:
                        async for sse in events:
                            if not sse.data:
                                continue
                            event = self.state.accept(sse)
                            if event is not None:
                                attempt = 0
                                yield event
                                if self.state.turn is not None:
                                    return
            except BROKEN as exc:
                if self.state.conversation_id is None:
                    raise ConnectionFailed(
                        f"cannot reach {self._http.base_url}: {exc}", url=str(self._http.base_url)
                    ) from exc
            if self.state.turn is not None:
                return
            if attempt >= self.max_resumes:
                raise StreamInterrupted(
                    f"the event stream broke {attempt + 1} times; last event {self.state.last_event_id}",
                    url=str(self._http.base_url),
                )
            await asyncio.sleep(_backoff(attempt))
            attempt += 1
            self.state.resumes += 1
            path, resume_headers, params = self.state.resume_request()
            request = ("GET", path, resume_headers, params, None)

    async def until_done(self) -> TurnOut:
        """Read the stream to its end; the ended turn."""
        async for _ in self:
            pass
        if self.state.turn is None:
            raise StreamInterrupted(
                "the stream ended without the turn's end event", url=str(self._http.base_url)
            )
        return self.state.turn
