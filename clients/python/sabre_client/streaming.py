"""A turn's events over SSE, resumed from the last event id when the connection breaks.

A streamed POST answers with the turn's events (its ``Location`` names the conversation and the
turn). If the connection drops before the turn's end event, the stream goes on from
``GET /v1/conversations/{id}/events`` with ``Last-Event-ID``: the server replays what was stored
after that event and follows the turn live, so no event is lost or repeated.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from httpx_sse import ServerSentEvent, aconnect_sse, connect_sse
from sabre_api.models.event_out import EventOut
from sabre_api.models.turn_out import TurnOut

from sabre_client.errors import ConnectionFailed, StreamInterrupted, error_for

END_TYPES: Final = frozenset(
    {"turn.completed", "turn.awaiting_tool_results", "turn.failed", "turn.cancelled"}
)
SSE_HEADERS: Final = {"Accept": "text/event-stream"}
BROKEN: Final = (httpx.TransportError, httpx.StreamError)


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
                    for sse in source.iter_sse():
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
                    async for sse in source.aiter_sse():
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
