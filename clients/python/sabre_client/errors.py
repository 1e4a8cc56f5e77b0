"""Typed errors: every problem+json answer becomes an ``ApiError`` subclass chosen by its status,
carrying the problem's ``code`` and fields; a server out of reach is ``ConnectionFailed``."""

from __future__ import annotations

import json
from typing import Any, ClassVar, TypeVar

import httpx
from sabre_api.models.problem import Problem
from sabre_api.types import Response

T = TypeVar("T")


class SabreError(Exception):
    """Base of everything this SDK raises."""


class ConnectionFailed(SabreError):
    """The server could not be reached (down, wrong URL, network cut) or the connection broke."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class StreamInterrupted(ConnectionFailed):
    """A stream of turn events broke and could not be resumed within the retries allowed."""


class EventTooLarge(SabreError):
    """One event of a stream passed ``limit`` bytes (``MAX_EVENT_BYTES``): the server is broken or
    hostile. The stream stops there and is not resumed (the server would send the same event again)."""

    def __init__(self, limit: int, *, url: str) -> None:
        super().__init__(f"an event of the stream from {url} passed {limit} bytes; the stream was dropped")
        self.limit = limit
        self.url = url


class ApiError(SabreError):
    """The server answered with an error (RFC 9457 problem+json).

    ``code`` is stable (``turn_running``, ``precondition_failed``…), for programs; ``detail`` is for
    people. ``current`` (the conversation's version, the running turn), ``errors`` (validation) and
    ``expected_tool_call_ids`` are set when the server sends them.
    """

    status: ClassVar[int] = 0

    def __init__(self, *, status: int, body: dict[str, Any], headers: httpx.Headers) -> None:
        self.status_code = status
        self.body = body
        self.code: str = str(body.get("code", f"http_{status}"))
        self.title: str = str(body.get("title", ""))
        self.detail: str = str(body.get("detail", ""))
        self.instance: str | None = body.get("instance")
        self.errors: list[dict[str, Any]] = list(body.get("errors") or [])
        self.current: dict[str, Any] = dict(body.get("current") or {})
        self.expected_tool_call_ids: list[str] = list(body.get("expected_tool_call_ids") or [])
        retry_after = headers.get("retry-after")
        self.retry_after: float | None = (
            float(retry_after) if retry_after and _is_number(retry_after) else None
        )
        super().__init__(f"{status} {self.code}: {self.detail or self.title}")

    @property
    def problem(self) -> Problem | None:
        """The body as the generated ``Problem`` model (None if the body was not a problem)."""
        try:
            return Problem.from_dict(self.body)
        except (KeyError, TypeError, ValueError):
            return None


class BadRequestError(ApiError):
    status = 400


class AuthenticationError(ApiError):
    status = 401


class NotFoundError(ApiError):
    status = 404


class ConflictError(ApiError):
    status = 409


class GoneError(ApiError):
    status = 410


class PreconditionFailedError(ApiError):
    status = 412


class PayloadTooLargeError(ApiError):
    status = 413


class UnprocessableError(ApiError):
    status = 422


class RateLimitError(ApiError):
    status = 429


class InternalServerError(ApiError):
    status = 500


class ServiceUnavailableError(ApiError):
    status = 503


_BY_STATUS: dict[int, type[ApiError]] = {
    cls.status: cls
    for cls in (
        BadRequestError,
        AuthenticationError,
        NotFoundError,
        ConflictError,
        GoneError,
        PreconditionFailedError,
        PayloadTooLargeError,
        UnprocessableError,
        RateLimitError,
        InternalServerError,
        ServiceUnavailableError,
    )
}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def error_for(status: int, content: bytes, headers: httpx.Headers) -> ApiError:
    """The typed error for an error answer (any body: a proxy's HTML page still gives a typed error)."""
    try:
        body = json.loads(content) if content else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    body.setdefault("detail", content[:300].decode(errors="replace") if content and not body else "")
    cls = _BY_STATUS.get(status) or (InternalServerError if status >= 500 else ApiError)
    return cls(status=status, body=body, headers=headers)


def unwrap(response: Response[T | Problem] | Response[T]) -> T:
    """The parsed body of a successful answer of a generated ``*_detailed`` function; an ``ApiError``
    subclass for an error answer."""
    status = int(response.status_code)
    if status >= 400 or isinstance(response.parsed, Problem):
        raise error_for(status, response.content, httpx.Headers(dict(response.headers)))
    return response.parsed  # type: ignore[return-value]
