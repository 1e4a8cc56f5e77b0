"""Reject request bodies over a size limit before they are read into memory (413 problem+json)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.kit.errors import PayloadTooLarge, problem_response


class BodyLimitMiddleware:
    """Pure ASGI middleware: checks Content-Length up front and counts streamed bytes."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = PayloadTooLarge(
            f"The request body is over {self.max_bytes} bytes (SABRE_MAX_BODY_BYTES)."
        )
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await problem_response(too_large.to_problem(instance=scope.get("path")))(scope, receive, send)
                return
        received = 0
        response_started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not response_started:
                await problem_response(too_large.to_problem(instance=scope.get("path")))(scope, receive, send)


class _TooLarge(Exception):
    """Raised inside the app's receive loop when the streamed body passes the limit."""
