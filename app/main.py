"""The application factory; the lifespan owns engines, the Redis client, the LLM client and the pool."""

from __future__ import annotations

import gc
import hmac
import os
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import fields
from typing import Any, Literal, NoReturn

import structlog
from fastapi import FastAPI, Request, Response
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import text
from uvicorn.config import STARTUP_FAILURE

from app.config import Settings
from app.conversations.endpoints import router as conversations_router
from app.files.endpoints import router as files_router
from app.kit.access import REQUEST_ID_HEADER, RequestContextMiddleware
from app.kit.body_limit import BodyLimitMiddleware
from app.kit.errors import (
    NotFound,
    ServiceUnavailable,
    Unauthorized,
    install_error_handlers,
    problem_response,
)
from app.kit.logging import ensure_logging
from app.kit.metrics import CONTENT_TYPE, exposition
from app.kit.openapi import install_openapi, operation_id, problem_responses
from app.kit.routing import add_routes
from app.openai_compat.endpoints import router as openai_compat_router
from app.openai_compat.schemas import ChatCompletionChunk
from app.personas.endpoints import router as personas_router
from app.personas.loader import PersonaError
from app.wiring import Resources, StartupError, open_resources

log = structlog.get_logger(__name__)

VERSION = "0.1.0"
SERVERS: list[dict[str, Any]] = [
    {"url": "http://127.0.0.1:8011", "description": "`sabre serve` on this machine (its default port)."},
    {
        "url": "{base_url}",
        "description": "Another deployment.",
        "variables": {"base_url": {"default": "https://sabre.example.com"}},
    },
]


class Health(BaseModel):
    """Liveness: the process answers."""

    status: Literal["ok"]


class Readiness(BaseModel):
    """Readiness: what was checked, and the sandbox isolation in force."""

    status: Literal["ok"]
    checks: dict[str, str] = Field(description="`store` and (when configured) `redis`: `ok`.")
    sandbox: str = Field(description="The isolation blocks run under: `bwrap` or `process`.")


API_DESCRIPTION = """\
**Authentication.** `Authorization: Bearer <API key>`; every key acts for one tenant.

**Request ids.** Send `X-Request-ID` (1-128 characters of `A-Z a-z 0-9 . _ : / + = @ -`) to have
it kept, or one is made; every response carries it, and the server's log lines for the request and
for the turn it starts carry it too. A W3C `traceparent` continues the caller's trace when the server
exports traces.

**Limits.** A tenant's requests per window, turns queued or running at once, and model tokens per
window can be limited by the operator. Over a limit, the request is refused before it does anything
with `429` and a problem whose `code` is `rate_limited`, `concurrent_turns_limited` or
`token_quota_exceeded`, a `Retry-After` (seconds), and for rates and quotas the IETF `RateLimit-Policy`
(`"requests";q=<limit>;w=<window s>`, `"tokens";…`) and `RateLimit` (`…;r=<remaining>;t=<reset s>`)
fields.
"""

__all__ = ["StartupError", "create_app", "openapi_json"]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open every shared resource once per process (app.wiring), close them on shutdown."""
    async with AsyncExitStack() as stack:
        try:
            resources = await stack.enter_async_context(open_resources(app.state.settings))
        except (StartupError, PersonaError) as exc:
            if app.state.exit_on_startup_error:
                _refuse_to_start(exc)
            raise
        app.state.resources = resources
        for field in fields(Resources):  # app.state.pool, .sessionmaker…: what dependencies read
            if field.name != "settings":
                setattr(app.state, field.name, getattr(resources, field.name))
        freeze_startup_heap()
        yield


def freeze_startup_heap() -> None:
    """Move what start-up built (modules, models, the SDKs' types: live for the whole process)
    out of the cyclic GC's reach: a full collection then scans only what requests made, instead
    of stopping the event loop for ~0.2 s every few hundred requests (measured under load)."""
    gc.collect()
    gc.freeze()


def _refuse_to_start(exc: Exception) -> NoReturn:
    """End a ``sabre serve`` process that must not start: one log line saying why, and uvicorn's
    start-up failure status (3, which also stops a multi-worker parent), not a traceback."""
    log.error("startup_refused", reason=str(exc))
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(STARTUP_FAILURE)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; every dependency it needs comes from ``settings`` (default: the environment)."""
    app = FastAPI(
        title="SABRE",
        version=VERSION,
        summary="Run LLM agents that act by writing Python, over HTTP.",
        description=API_DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
    )
    app.state.settings = settings = settings or Settings()
    # Here, not only in the CLI: each `sabre serve --workers N` process builds its own app.
    ensure_logging(level=settings.log_level, fmt=settings.log_format)
    app.state.exit_on_startup_error = False
    install_openapi(app, servers=SERVERS, models=[ChatCompletionChunk])  # the stream's events
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if origins:
        # Bearer keys, never cookies: no credentials mode, so "*" is safe to allow.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE", "OPTIONS"],
            allow_headers=[
                "Authorization",
                "Content-Type",
                "Idempotency-Key",
                "If-Match",
                REQUEST_ID_HEADER,
                "Last-Event-ID",
                "traceparent",
                "tracestate",
            ],
            expose_headers=[
                REQUEST_ID_HEADER,
                "Location",
                "Retry-After",
                "RateLimit",
                "RateLimit-Policy",
                "Idempotent-Replayed",
            ],
            max_age=600,
        )
    # Outermost: every response (errors and CORS preflights included) carries the request id.
    app.add_middleware(RequestContextMiddleware)
    add_routes(app, conversations_router, personas_router, files_router, openai_compat_router)

    @app.get("/metrics", include_in_schema=False, operation_id="metrics.read")
    async def metrics(request: Request) -> Response:
        """Prometheus metrics: behind SABRE_METRICS_KEY, or open on a keyless loopback server; with
        SABRE_METRICS_PORT they are served on that port instead."""
        check_metrics_access(request)
        return Response(exposition(), media_type=CONTENT_TYPE)

    @app.get("/healthz", tags=["health"], operation_id="health.live", response_model=Health)
    async def healthz() -> Health:
        """Liveness: the process answers."""
        return Health(status="ok")

    @app.get(
        "/readyz",
        tags=["health"],
        operation_id="health.ready",
        response_model=Readiness,
        responses=problem_responses(503),
    )
    async def readyz(request: Request) -> Any:
        """Readiness: the store and (when configured) Redis answer, and the sandbox pool is up."""
        state = request.app.state
        checks: dict[str, str] = {}
        try:
            async with state.engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
            checks["store"] = "ok"
        except Exception as exc:
            checks["store"] = f"error: {type(exc).__name__}"
        if state.redis is not None:
            try:
                await state.redis.ping()
                checks["redis"] = "ok"
            except Exception as exc:
                checks["redis"] = f"error: {type(exc).__name__}"
        if all(value == "ok" for value in checks.values()):
            # ``sandbox``: the isolation in force (bwrap or process), for operators and probes.
            return JSONResponse({"status": "ok", "checks": checks, "sandbox": state.pool.sandbox})
        problem = ServiceUnavailable(
            "Not ready: " + ", ".join(f"{k} {v}" for k, v in checks.items() if v != "ok")
        ).to_problem(instance="/readyz")
        problem.current = checks
        return problem_response(problem)

    return app


def check_metrics_access(request: Request) -> None:
    """Who may read ``/metrics`` on the API port (README, "Operations")."""
    settings: Settings = request.app.state.settings
    hint = "Serve them with SABRE_METRICS_PORT, or set SABRE_METRICS_KEY and send it as a Bearer token."
    if settings.metrics_port is not None:
        raise NotFound(f"Metrics are served on port {settings.metrics_port}, not here.")
    # An empty key is no key (compose passes an unset variable as ''): else `Bearer ` matched it.
    key = settings.metrics_key.get_secret_value().strip() if settings.metrics_key is not None else ""
    if key:
        scheme, _, sent = request.headers.get("authorization", "").partition(" ")
        matches = hmac.compare_digest(sent.strip().encode(), key.encode())
        if scheme.lower() != "bearer" or not matches:
            raise Unauthorized("Send the metrics key: `Authorization: Bearer <SABRE_METRICS_KEY>`.")
        return
    if not request.app.state.authenticator.open_mode:
        raise NotFound("Metrics are not served on the API port of a server with API keys. " + hint)


def create_served_app() -> FastAPI:
    """The app ``sabre serve`` runs (uvicorn's factory): settings from the environment, and a
    start-up refusal ends the process with one line instead of raising into uvicorn."""
    app = create_app()
    app.state.exit_on_startup_error = True
    return app


def openapi_json() -> str:
    """The app's OpenAPI document, serialised stably (sorted keys, trailing newline)."""
    import json

    return json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"
