"""Every request's id, access log line, HTTP metrics and root span (one pure ASGI middleware).

``X-Request-ID``: a caller's id is kept when it is a short token (1-128 of ``A-Z a-z 0-9 . _ : / +
= @ -``), else a new one replaces it (a forged header cannot inject text into the logs); either
way it is answered in the response's ``X-Request-ID`` and bound into structlog's context, so every
line logged for the request, and for the turn it starts (tasks copy the context; a background job
carries it in its arguments), has ``request_id``.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Final

import structlog
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.kit import tracing
from app.kit.metrics import HTTP_REQUESTS, HTTP_SECONDS

log = structlog.get_logger("sabre.access")

REQUEST_ID_HEADER: Final = "X-Request-ID"
_VALID_ID = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,128}")
_UNMATCHED: Final = "<unmatched>"
# Probes and scrapes that succeed are logged at debug level only: they would drown the rest.
_QUIET: Final = frozenset({"/healthz", "/readyz", "/metrics"})
# Methods named in metrics and span names; any other token a client sends (h11 takes any) is one
# label, "_OTHER" (OpenTelemetry's convention), not a new series per made-up method.
_KNOWN_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_OTHER_METHOD: Final = "_OTHER"


def accepted_request_id(raw: bytes | None) -> str | None:
    """The caller's request id if it is a short token, else None (a new one is made)."""
    if raw is None or _VALID_ID.fullmatch(raw) is None:
        return None
    return raw.decode("ascii")


def method_label(method: str) -> str:
    """``method`` if it is a standard one, else ``_OTHER``: a bounded metric label and span name."""
    return method if method in _KNOWN_METHODS else _OTHER_METHOD


def new_request_id() -> str:
    """A fresh request id (32 hex digits)."""
    return uuid.uuid4().hex


def route_template(scope: Scope) -> str:
    """The matched route's path template (``/v1/conversations/{conversation_id}``), never the raw
    path: a bounded label and no ids in metrics."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else _UNMATCHED


class RequestContextMiddleware:
    """Binds the request id, answers it, and on the way out logs and counts the request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                raw = value
                break
        request_id = accepted_request_id(raw) or new_request_id()
        state: dict[str, Any] = scope.setdefault("state", {})
        state["request_id"] = request_id
        method: str = scope["method"]
        method_name = method_label(method)
        status = 500  # what the log says if the app fails before answering

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                headers.append(REQUEST_ID_HEADER, request_id)
            await send(message)

        started = time.perf_counter()
        # What the request binds (its id; the turn's ids once one starts) ends with it.
        outer = structlog.contextvars.get_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            if raw is not None and request_id.encode() != raw:
                log.info("request_id_replaced", reason="not a 1-128 character token", length=len(raw))
            with tracing.server_span(
                f"{method_name} request", headers=_header_map(scope) if tracing.enabled() else {}
            ) as span:
                try:
                    await self.app(scope, receive, send_with_id)
                finally:
                    seconds = time.perf_counter() - started
                    route = route_template(scope)
                    HTTP_REQUESTS.labels(method=method_name, route=route, status=str(status)).inc()
                    HTTP_SECONDS.labels(method=method_name, route=route).observe(seconds)
                    if tracing.enabled():
                        span.update_name(f"{method_name} {route}")
                        span.set_attribute("http.route", route)
                        span.set_attribute("http.response.status_code", status)
                    quiet = route in _QUIET and status < 400
                    (log.debug if quiet else log.info)(
                        "request",
                        method=method,
                        path=route,
                        status=status,
                        duration_ms=round(seconds * 1000, 2),
                        tenant=state.get("tenant"),
                    )
        finally:
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(**outer)


def _header_map(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
