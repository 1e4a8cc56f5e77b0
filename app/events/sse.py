"""Events over Server-Sent Events: ``id:`` is the seq, ``event:`` the type, ``data:`` the JSON.

One writer for every stream the API serves (``GET .../events`` and the streamed POSTs), built on
sse-starlette: it sends a ping comment every ``PING_SECONDS`` and closes a stream whose consumer
does not take a write within ``SEND_TIMEOUT_SECONDS``, so a stalled client never holds anything.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from app.events.schemas import EventOut
from app.events.stream import CutOff, Heartbeat

PING_SECONDS: Final = 15
SEND_TIMEOUT_SECONDS: Final = 30.0


async def _encode(items: AsyncIterator[EventOut | Heartbeat | CutOff]) -> AsyncIterator[ServerSentEvent]:
    async for item in items:
        if isinstance(item, EventOut):
            yield ServerSentEvent(data=item.model_dump_json(), event=item.type, id=str(item.seq))
        elif isinstance(item, Heartbeat):
            yield ServerSentEvent(comment="heartbeat")
        else:
            yield ServerSentEvent(comment="cut off: too far behind; reconnect with Last-Event-ID")
            return


class _EventSource(EventSourceResponse):
    """An SSE response that calls ``on_close`` once it is over, however it ended (its items done,
    its client gone, a send timed out, the server shutting down)."""

    def __init__(self, *args: Any, on_close: Callable[[], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._on_close is not None:
                self._on_close()


def event_stream(
    items: AsyncIterator[EventOut | Heartbeat | CutOff],
    *,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
    on_close: Callable[[], None] | None = None,
) -> EventSourceResponse:
    """An SSE response of ``items``; it ends when they do. ``on_close`` is called when it is over
    (the release of the stream's place among its tenant's, ``TenantLimiter.open_stream``), or when
    the response is dropped without being sent (a failure between the endpoint and the send): a
    place never given back would shrink its tenant's streams for the process's life."""
    response = _EventSource(
        _encode(items),
        status_code=status_code,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", **(headers or {})},
        ping=PING_SECONDS,
        send_timeout=SEND_TIMEOUT_SECONDS,
        on_close=on_close,
    )
    if on_close is not None:
        weakref.finalize(response, on_close)  # the release is idempotent: a sent stream's is a no-op
    return response
