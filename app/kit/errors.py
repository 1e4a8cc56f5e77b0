"""One error base for the service, rendered as RFC 9457 problem+json by one handler."""

from __future__ import annotations

from typing import Any, ClassVar

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = structlog.get_logger(__name__)

PROBLEM_JSON = "application/problem+json"
WWW_AUTHENTICATE = 'Bearer realm="sabre"'


class Problem(BaseModel):
    """The problem+json body every error response carries (RFC 9457); ``code`` is stable, for programs."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "type": "https://sabre.dev/problems/precondition_failed",
                    "title": "Precondition failed",
                    "status": 412,
                    "code": "precondition_failed",
                    "detail": "If-Match is '\"2\"' but the conversation is at version 3.",
                    "instance": "/v1/conversations/conv_123/messages",
                    "current": {"version": 3},
                }
            ]
        }
    )

    type: str
    title: str
    status: int
    code: str
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None
    expected_tool_call_ids: list[str] | None = None
    current: dict[str, Any] | None = None


class SabreError(Exception):
    """Base of every error a client may see; subclasses fix the status, code and title."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    title: ClassVar[str] = "Internal error"
    class_headers: ClassVar[dict[str, str]] = {}
    """Response headers every error of the class carries (``WWW-Authenticate`` on a 401)."""

    def __init__(
        self, detail: str, *, extra: dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra or {}
        # The class's headers, and those of this error (Retry-After, RateLimit…).
        self.headers: dict[str, str] = {**self.class_headers, **(headers or {})}

    def to_problem(self, *, instance: str | None = None) -> Problem:
        """The problem+json body for this error."""
        return Problem(
            type=f"https://sabre.dev/problems/{self.code}",
            title=self.title,
            status=self.status,
            code=self.code,
            detail=self.detail,
            instance=instance,
            **self.extra,
        )


class BadRequest(SabreError):
    status = 400
    code = "bad_request"
    title = "Bad request"


class InvalidJSON(BadRequest):
    code = "invalid_json"
    title = "Malformed JSON body"


class Unauthorized(SabreError):
    status = 401
    code = "unauthorized"
    title = "Missing or invalid API key"
    class_headers: ClassVar[dict[str, str]] = {"WWW-Authenticate": WWW_AUTHENTICATE}


class NotFound(SabreError):
    status = 404
    code = "not_found"
    title = "Not found"


class Conflict(SabreError):
    status = 409
    code = "conflict"
    title = "Conflict with the current state"


class Gone(SabreError):
    status = 410
    code = "gone"
    title = "Gone"


class PreconditionFailed(SabreError):
    status = 412
    code = "precondition_failed"
    title = "Precondition failed"


class PayloadTooLarge(SabreError):
    status = 413
    code = "payload_too_large"
    title = "Payload too large"


class Unprocessable(SabreError):
    status = 422
    code = "validation_error"
    title = "Request validation failed"


class TooManyRequests(SabreError):
    """A limit refused the request before it did anything; ``headers`` say when to retry."""

    status = 429
    code = "rate_limited"
    title = "Too many requests"


class ServiceUnavailable(SabreError):
    status = 503
    code = "unavailable"
    title = "Service unavailable"


def _lost_connection(exc: BaseException) -> DBAPIError | None:
    """The database error in ``exc`` or its causes that says the connection (or the server) went
    away. A lost connection can surface as the failure of the cleanup it broke (a rollback that
    cannot run): then it is a cause that tells."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DBAPIError) and (
            current.connection_invalidated or isinstance(current, OperationalError | InterfaceError)
        ):
            return current
        current = current.__cause__ or current.__context__
    return None


class DatabaseUnavailable(ServiceUnavailable):
    code = "database_unavailable"
    title = "Database unavailable"


def problem_response(problem: Problem, *, headers: dict[str, str] | None = None) -> JSONResponse:
    """Render a Problem with the problem+json media type."""
    return JSONResponse(
        problem.model_dump(exclude_none=True),
        status_code=problem.status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def _clean_validation_errors(errors: Any) -> list[dict[str, Any]]:
    """Keep the parts of pydantic's errors that help a client (location, message, type)."""
    cleaned: list[dict[str, Any]] = []
    for err in errors:
        loc = [part for part in err.get("loc", ()) if part != "body"]
        message = str(err.get("msg", "")).removeprefix("Value error, ")
        cleaned.append({"loc": loc, "msg": message, "type": str(err.get("type", ""))})
    return cleaned


def _allowed_methods(request: Request) -> set[str]:
    """Every method some route serves at the request's path."""
    from fastapi.routing import iter_route_contexts
    from starlette.routing import Match

    allowed: set[str] = set()
    for route in iter_route_contexts(request.app.routes):
        methods = route.methods
        if methods and route.matches(request.scope)[0] is not Match.NONE:
            allowed.update(methods)
    return allowed


def install_error_handlers(app: FastAPI) -> None:
    """Route every error (ours, validation, routing, unexpected) through problem+json."""

    @app.exception_handler(SabreError)
    async def _sabre_error(request: Request, exc: SabreError) -> JSONResponse:
        return problem_response(exc.to_problem(instance=request.url.path), headers=exc.headers or None)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _clean_validation_errors(exc.errors())
        if any(e["type"] == "json_invalid" for e in errors):
            problem = InvalidJSON("The request body is not valid JSON.").to_problem(instance=request.url.path)
            problem.errors = errors
            return problem_response(problem)
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"]) or "body"
        problem = Unprocessable(f"{where}: {first['msg']}").to_problem(instance=request.url.path)
        problem.errors = errors
        return problem_response(problem)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}
        code = codes.get(exc.status_code, f"http_{exc.status_code}")
        problem = Problem(
            type=f"https://sabre.dev/problems/{code}",
            title=str(exc.detail) if exc.status_code != 404 else "Not found",
            status=exc.status_code,
            code=code,
            detail=str(exc.detail) if exc.status_code != 404 else f"No route for {request.url.path}",
            instance=request.url.path,
        )
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route on the path; a path served by several
            # routes (GET, PATCH and DELETE of a conversation) allows them all.
            headers["Allow"] = ", ".join(sorted(_allowed_methods(request)))
        return problem_response(problem, headers=headers or None)

    @app.exception_handler(DBAPIError)
    async def _database_error(request: Request, exc: DBAPIError) -> JSONResponse:
        if _lost_connection(exc) is None:
            return await _unexpected(request, exc)
        # A lost connection (database restarted, network cut): the pool has dropped its stale
        # connections, so the same request can be sent again (an Idempotency-Key makes that safe).
        log.warning("database_unavailable", path=request.url.path, error=type(exc.orig).__name__)
        problem = DatabaseUnavailable(
            "The database connection was lost or refused. Retry the request (with the same "
            "Idempotency-Key, if it had one)."
        ).to_problem(instance=request.url.path)
        return problem_response(problem, headers={"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        lost = None if isinstance(exc, DBAPIError) else _lost_connection(exc)
        if lost is not None:
            return await _database_error(request, lost)
        log.exception("unhandled_error", path=request.url.path)
        problem = SabreError("An unexpected error occurred; it has been logged.").to_problem(
            instance=request.url.path
        )
        return problem_response(problem)
