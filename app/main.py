"""The application factory; the lifespan owns engines, the Redis client, the LLM client and the pool."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import fields
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import make_asgi_app
from sqlalchemy import text

from app.config import Settings
from app.conversations.endpoints import router as conversations_router
from app.files.endpoints import router as files_router
from app.kit.body_limit import BodyLimitMiddleware
from app.kit.errors import ServiceUnavailable, install_error_handlers, problem_response
from app.personas.endpoints import router as personas_router
from app.wiring import Resources, StartupError, open_resources

log = structlog.get_logger(__name__)

VERSION = "0.1.0"

__all__ = ["StartupError", "create_app", "openapi_json"]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open every shared resource once per process (app.wiring), close them on shutdown."""
    async with open_resources(app.state.settings) as resources:
        app.state.resources = resources
        for field in fields(Resources):  # app.state.pool, .sessionmaker…: what dependencies read
            if field.name != "settings":
                setattr(app.state, field.name, getattr(resources, field.name))
        yield


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; every dependency it needs comes from ``settings`` (default: the environment)."""
    app = FastAPI(
        title="SABRE",
        version=VERSION,
        summary="Run LLM agents that act by writing Python, over HTTP.",
        lifespan=lifespan,
    )
    app.state.settings = settings or Settings()
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=app.state.settings.max_body_bytes)
    app.include_router(conversations_router)
    app.include_router(personas_router)
    app.include_router(files_router)

    app.mount("/metrics", make_asgi_app())

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
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


def openapi_json() -> str:
    """The app's OpenAPI document, serialised stably (sorted keys, trailing newline)."""
    import json

    return json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"
