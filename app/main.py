"""The application factory; the lifespan owns engines, the Redis client, the LLM client and the pool."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import make_asgi_app
from redis.asyncio import Redis
from sqlalchemy import text

from app.auth.repository import ApiKeyRepository
from app.auth.service import Authenticator
from app.config import Settings, is_loopback
from app.conversations.endpoints import router as conversations_router
from app.conversations.locks import ConversationLocks, DatabaseLocks, RedisLocks
from app.files.endpoints import router as files_router
from app.helpers.net import FetchLimits
from app.kit import migrate
from app.kit.body_limit import BodyLimitMiddleware
from app.kit.datadir import secure_data_dir
from app.kit.db import create_engine, create_sessionmaker
from app.kit.errors import ServiceUnavailable, install_error_handlers, problem_response
from app.kit.redis import create_redis
from app.llm import make_llm_client
from app.orchestrator.loop import TurnLoop
from app.personas.endpoints import router as personas_router
from app.personas.models import Persona
from app.personas.service import load_configured_personas
from app.runtime import RuntimePool
from app.runtime.isolation import Backend
from app.tools.mcp import McpConfigError, McpManager, unconfigured_references

log = structlog.get_logger(__name__)

VERSION = "0.1.0"


class StartupError(RuntimeError):
    """The service refuses to start; the message says why and how to fix it."""


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open every shared resource once per process, close them on shutdown."""
    settings: Settings = app.state.settings
    static_keys = settings.static_api_keys()
    personas = load_configured_personas(settings)
    mcp = _mcp_manager(settings, personas=personas.values())

    secure_data_dir(settings.data_dir)
    if settings.is_sqlite:
        # The embedded store upgrades itself; PostgreSQL is upgraded with `sabre migrate`.
        await migrate.upgrade(settings.effective_database_url)
    engine = create_engine(settings.effective_database_url, pre_ping=settings.database_pre_ping)
    sessionmaker = create_sessionmaker(engine)

    async with sessionmaker() as session:
        stored_keys = await ApiKeyRepository(session).count_live()
    open_mode = not static_keys and stored_keys == 0
    if open_mode and not is_loopback(settings.host):
        await engine.dispose()
        raise StartupError(
            f"No API keys are configured, so SABRE only listens on a loopback address, not "
            f"{settings.host!r}. Set SABRE_API_KEYS=tenant:key or run `sabre keys create`."
        )

    # Off a keyless loopback-only server, blocks never run without namespaces unless
    # SABRE_SANDBOX=process says so: auto refuses to fall back.
    namespaces_required = _namespaces_required(settings, open_mode=open_mode)
    pool = RuntimePool(
        size=settings.runtime_workers,
        preload=settings.preload_modules,
        sandbox=settings.sandbox,
        workspaces=settings.workspaces_dir,
        park_seconds=settings.runtime_park_seconds,
        fallback=namespaces_required is None,
        bwrap=None if settings.bwrap_path is None else str(settings.bwrap_path),
    )
    try:
        await pool.start()
    except RuntimeError as exc:
        await engine.dispose()
        raise StartupError(_sandbox_problem(settings, pool, exc, namespaces_required)) from exc
    if pool.fallback_reason is not None:
        log.warning(
            "sandbox_fallback_to_process",
            reason=pool.fallback_reason,
            allowed_because="no API keys are configured and SABRE_HOST is a loopback address",
            consequence=(
                "blocks run without namespaces; with API keys or another address SABRE refuses to "
                "start until bubblewrap works (README, Sandbox)"
            ),
        )

    redis: Redis | None = create_redis(settings.redis_url) if settings.redis_url else None
    locks: ConversationLocks = (
        RedisLocks(redis, lease_seconds=settings.lock_lease_seconds)
        if redis is not None
        else DatabaseLocks(sessionmaker, lease_seconds=settings.lock_lease_seconds)
    )
    llm = make_llm_client(
        api=settings.llm_api,
        base_url=settings.openai_base_url,
        api_key=settings.openai_api_key.get_secret_value() if settings.openai_api_key else None,
        timeout=settings.llm_timeout_seconds,
        max_retries=settings.llm_max_retries,
        retry_base_delay=settings.llm_retry_base_delay,
    )

    app.state.engine = engine
    app.state.sessionmaker = sessionmaker
    app.state.redis = redis
    app.state.locks = locks
    app.state.personas = personas
    app.state.authenticator = Authenticator(static_keys=static_keys, open_mode=open_mode)
    app.state.pool = pool
    app.state.mcp = mcp
    app.state.llm = llm
    app.state.turn_loop = TurnLoop(
        llm=llm,
        pool=pool,
        max_output_chars=settings.max_output_chars,
        images=settings.llm_images,
        fetch_limits=FetchLimits.from_settings(settings),
    )
    log.info(
        "sabre_started",
        store="sqlite" if settings.is_sqlite else "postgresql",
        redis=redis is not None,
        auth="open (loopback only)" if open_mode else "api keys",
        llm_api=settings.llm_api,
        sandbox=pool.sandbox,
        **({"sandbox_reason": pool.fallback_reason} if pool.fallback_reason is not None else {}),
    )
    try:
        yield
    finally:
        await mcp.aclose()
        await pool.aclose()
        await llm.aclose()
        if redis is not None:
            await redis.aclose()
        await engine.dispose()


def _namespaces_required(settings: Settings, *, open_mode: bool) -> str | None:
    """Why this server may not run blocks without namespaces (None: it may, as a keyless server
    only this machine reaches): anyone with a key, or on the network, could then reach them."""
    reasons: list[str] = []
    if not open_mode:
        reasons.append("API keys are configured")
    if not is_loopback(settings.host):
        reasons.append(f"SABRE_HOST={settings.host} is not a loopback address")
    return " and ".join(reasons) or None


def _sandbox_problem(
    settings: Settings, pool: RuntimePool, exc: RuntimeError, namespaces_required: str | None
) -> str:
    """The start-up error for a sandbox that cannot start: what failed, why that stops the
    service, and how to fix it (when choosing the backend failed; not a worker's own failure)."""
    chosen: Backend | None
    try:
        chosen = pool.sandbox
    except RuntimeError:
        chosen = None  # bubblewrap's probe failed, so no backend was chosen
    message = f"The sandbox cannot start: {str(exc).rstrip('.')}."
    if chosen is not None:
        return message
    if settings.sandbox == "auto" and namespaces_required is not None:
        message += (
            " SABRE_SANDBOX=auto runs blocks without namespaces only on a server with no API keys "
            f"that listens on loopback, and here {namespaces_required}."
        )
    return message + (
        " To fix it, let unprivileged processes create user namespaces: sysctl "
        "kernel.unprivileged_userns_clone=1 (where that setting exists), user.max_user_namespaces "
        "above 0, kernel.apparmor_restrict_unprivileged_userns=0 (Ubuntu 23.10 and later); in a "
        "container, run it with --security-opt seccomp=unconfined --security-opt "
        "systempaths=unconfined (the default seccomp profile refuses unshare and the masked /proc "
        "stops bubblewrap's own). Or set SABRE_SANDBOX=process to run blocks without namespaces, "
        "knowingly: the network stays open to them and other conversations' files are not hidden."
    )


def _mcp_manager(settings: Settings, *, personas: Iterable[Persona]) -> McpManager:
    """The MCP servers of ``mcp_servers.yaml`` (none are contacted yet: sessions open on first use).

    Every ``mcp://server/tool`` of a loaded persona must name a configured server: a typo there would
    otherwise surface only when the model first calls the tool.
    """
    try:
        mcp = McpManager.from_file(
            settings.mcp_servers,
            required="mcp_servers" in settings.model_fields_set,
            timeout=settings.mcp_timeout_seconds,
        )
    except McpConfigError as exc:
        raise StartupError(f"Invalid MCP configuration (SABRE_MCP_SERVERS): {exc}") from exc
    problems = unconfigured_references(personas, mcp.server_names)
    if problems:
        raise StartupError(
            f"Personas use MCP servers that {settings.mcp_servers} does not configure: " + "; ".join(problems)
        )
    return mcp


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
