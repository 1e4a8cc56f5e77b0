"""The resources one SABRE process shares between requests and jobs, opened and closed together.

The API's lifespan and ``sabre worker`` open the same set (store, Redis, locks, personas, MCP, the
sandbox pool, the LLM client, the turn loop), so a turn runs the same wherever it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

import structlog
from procrastinate import App as JobApp
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.auth.limits import TenantLimiter, parse_policies
from app.auth.repository import ApiKeyRepository
from app.auth.service import Authenticator
from app.config import Settings, is_loopback
from app.conversations import background
from app.conversations.background import defer_turn, recovering, run_stored_turn
from app.conversations.control import TurnControl
from app.conversations.locks import ConversationLocks, DatabaseLocks, RedisLocks
from app.events import webhooks
from app.events.bus import EventBus, LocalBus, RedisBus
from app.helpers.net import FetchLimits
from app.helpers.threads import HelperThreads
from app.kit import migrate, tracing
from app.kit.datadir import secure_data_dir
from app.kit.db import create_engine, create_sessionmaker, store_location, store_problem
from app.kit.jobs import build_job_app, worker_in_process
from app.kit.redis import create_redis
from app.llm import make_llm_client
from app.llm.base import LLMClient
from app.orchestrator.loop import TurnLoop
from app.personas.models import Persona
from app.personas.service import load_configured_personas
from app.runtime import RuntimePool
from app.runtime.isolation import Backend
from app.tools.mcp import McpConfigError, McpManager, unconfigured_references

log = structlog.get_logger(__name__)

Role = Literal["api", "worker"]

# The domains' job tasks (app.kit.jobs): every process's job app declares them all.
JOB_BLUEPRINTS: Final = (webhooks.blueprint, background.blueprint)
# How long start-up waits for the store and Redis to answer before refusing to start.
STORE_START_SECONDS: Final = 15.0


class StartupError(RuntimeError):
    """The service refuses to start; the message says why and how to fix it."""


@dataclass(slots=True)
class Resources:
    """What a process opens once and every request or job of it uses."""

    settings: Settings
    engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    redis: Redis | None
    locks: ConversationLocks
    personas: dict[str, Persona]
    authenticator: Authenticator
    pool: RuntimePool
    mcp: McpManager
    llm: LLMClient
    turn_loop: TurnLoop
    bus: EventBus  # turn events and cancels, across replicas with Redis
    control: TurnControl  # this process's running turns: cancel signals, detached tasks
    jobs: JobApp  # the job engine (app.kit.jobs): defer jobs here; workers run them
    limiter: TenantLimiter  # per-tenant rates, turns at once, token quotas (app.auth.limits)


@asynccontextmanager
async def open_resources(settings: Settings, *, role: Role = "api") -> AsyncIterator[Resources]:
    """Open every shared resource of one process (an API server or a ``sabre worker``), close them
    on exit; ``StartupError`` says why the process must not start.

    Each resource is closed by an exit stack from the moment it is open, in the reverse order:
    whatever fails (at start-up, or one close among the others), nothing opened before is left
    open (a failed start left the store's engine, the workers, Redis and tracing running)."""
    try:
        static_keys = settings.static_api_keys()
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    _check_webhook_settings(settings)
    try:
        parse_policies(settings)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    personas = load_configured_personas(settings)

    try:
        secure_data_dir(settings.data_dir)
    except OSError as exc:
        raise StartupError(
            f"The data directory {settings.data_dir} cannot be used ({exc.strerror or exc}): it must be "
            "writable by this user (SABRE_DATA_DIR)."
        ) from None
    async with AsyncExitStack() as stack:
        stack.callback(tracing.stop_tracing)  # last: spans of the closes below are still exported
        mcp = _mcp_manager(settings, personas=personas.values())
        stack.push_async_callback(mcp.aclose)
        engine, stored_keys = await _open_store(settings)
        stack.push_async_callback(engine.dispose)
        sessionmaker = create_sessionmaker(engine)
        open_mode = not static_keys and stored_keys == 0
        if open_mode and not is_loopback(settings.host):
            raise StartupError(
                f"No API keys are configured, so SABRE only listens on a loopback address, not "
                f"{settings.host!r}. Set SABRE_API_KEYS=tenant:key or run `sabre keys create`."
            )
        _check_model(settings)
        await _check_redis(settings)

        # Off a keyless loopback-only server, blocks never run without namespaces unless
        # SABRE_SANDBOX=process says so: auto refuses to fall back.
        namespaces_required = _namespaces_required(settings, open_mode=open_mode)
        pool = RuntimePool(
            size=settings.runtime_workers,
            preload=settings.preload_modules,
            plain_size=settings.runtime_plain_workers,
            sandbox=settings.sandbox,
            workspaces=settings.workspaces_dir,
            live_seconds=settings.runtime_live_seconds,
            live_processes=settings.runtime_live_processes,
            live_memory_mb=settings.runtime_live_memory_mb,
            fallback=namespaces_required is None,
            bwrap=None if settings.bwrap_path is None else str(settings.bwrap_path),
            cgroup_root=settings.sandbox_cgroup_root,
            lazy=settings.runtime_lazy_start,
        )
        stack.push_async_callback(pool.aclose)
        helper_threads = HelperThreads()
        stack.callback(helper_threads.close)
        try:
            await pool.start()
        except RuntimeError as exc:
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

        if tracing.start_tracing(settings):
            tracing.instrument_engine(engine)
        redis: Redis | None = create_redis(settings.redis_url) if settings.redis_url else None
        if redis is not None:
            stack.push_async_callback(redis.aclose)
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
            max_reply_chars=settings.llm_max_reply_chars,
        )
        stack.push_async_callback(llm.aclose)

        bus: EventBus = RedisBus(redis) if redis is not None else LocalBus()
        stack.push_async_callback(bus.aclose)
        control = TurnControl(bus)
        resources = Resources(
            settings=settings,
            engine=engine,
            sessionmaker=sessionmaker,
            redis=redis,
            locks=locks,
            personas=personas,
            authenticator=Authenticator(static_keys=static_keys, open_mode=open_mode),
            pool=pool,
            mcp=mcp,
            llm=llm,
            turn_loop=TurnLoop(
                llm=llm,
                pool=pool,
                max_output_chars=settings.max_output_chars,
                images=settings.llm_images,
                fetch_limits=FetchLimits.from_settings(settings),
                helper_threads=helper_threads,
            ),
            bus=bus,
            control=control,
            jobs=build_job_app(settings, blueprints=JOB_BLUEPRINTS),
            limiter=TenantLimiter(settings, redis=redis),
        )
        control.run_here = lambda turn_id: run_stored_turn(resources, turn_id)
        control.defer = lambda turn_id, tenant: defer_turn(resources, turn_id, tenant=tenant)
        # Closed after the detached turns (control, below): one ending then still queues its webhook.
        await resources.jobs.open_async()
        stack.push_async_callback(resources.jobs.close_async)
        stack.push_async_callback(control.aclose)
        await control.start()
        log.info(
            "sabre_started",
            role=role,
            store="sqlite" if settings.is_sqlite else "postgresql",
            redis=redis is not None,
            auth="open (loopback only)" if open_mode else "api keys",
            llm_api=settings.llm_api,
            sandbox=pool.sandbox,
            block_limits="per block" if pool.cgroups is not None else "per process",
            **({"sandbox_reason": pool.fallback_reason} if pool.fallback_reason is not None else {}),
        )
        async with recovering(resources), _job_worker(resources, role=role):
            yield resources


@asynccontextmanager
async def _job_worker(resources: Resources, *, role: Role) -> AsyncIterator[None]:
    """The API process's own job worker: always on the embedded store (its jobs live in this
    process), on PostgreSQL unless SABRE_WORKER_IN_SERVE is off. `sabre worker` runs its own."""
    settings = resources.settings
    if role == "api" and (settings.is_sqlite or settings.worker_in_serve):
        async with worker_in_process(resources.jobs, resources=resources):
            yield
    else:
        yield


async def _open_store(settings: Settings) -> tuple[AsyncEngine, int]:
    """The store's engine and its live stored API keys; ``StartupError`` in one line when the
    store cannot be reached or (PostgreSQL) its schema is not the one this code needs."""
    url = settings.effective_database_url
    engine: AsyncEngine | None = None
    try:
        async with asyncio.timeout(STORE_START_SECONDS):
            if settings.is_sqlite:
                # The embedded store upgrades itself; PostgreSQL is upgraded with `sabre migrate`.
                await migrate.upgrade(url)
            engine = create_engine(
                url,
                pre_ping=settings.database_pre_ping,
                idle_transaction_seconds=settings.lock_lease_seconds,
            )
            async with engine.connect() as connection:
                problem = None if settings.is_sqlite else await connection.run_sync(migrate.schema_problem)
            if problem is not None:
                raise StartupError(f"The store at {store_location(url)} is not ready: {problem}.")
            async with create_sessionmaker(engine)() as session:
                return engine, await ApiKeyRepository(session).count_live()
    except BaseException as exc:
        if engine is not None:
            await engine.dispose()
        if isinstance(exc, OSError | SQLAlchemyError | TimeoutError | ImportError):
            raise StartupError(store_problem(url, exc)) from None
        raise


def _check_model(settings: Settings) -> None:
    """A model endpoint is configured: OpenAI itself needs a key (a local server may need none)."""
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else ""
    if settings.openai_base_url is None and not key.strip():
        raise StartupError(
            "No model is configured: set OPENAI_API_KEY for OpenAI, or OPENAI_BASE_URL (with "
            "SABRE_LLM_API=chat for most servers) for another OpenAI-compatible server."
        )


async def _check_redis(settings: Settings) -> None:
    """SABRE_REDIS_URL, when set, answers a PING (otherwise the first turn would fail instead)."""
    if not settings.redis_url:
        return
    try:
        where = _redis_location(settings.redis_url)
        client = create_redis(settings.redis_url)
    except ValueError:
        # The parser's words may quote part of the password (an unencoded "/" in it ends the
        # host part): none of them are shown.
        raise StartupError(
            "SABRE_REDIS_URL is not a Redis URL: redis:// or rediss://, host, port 1-65535, "
            "and a password with its reserved characters (/ ? # @ :) percent-encoded."
        ) from None
    try:
        async with asyncio.timeout(STORE_START_SECONDS):
            await client.ping()
    except (RedisError, OSError, TimeoutError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise StartupError(
            f"Redis at {where} cannot be reached ({type(exc).__name__}: {reason[:300]}). "
            "Check SABRE_REDIS_URL."
        ) from None
    finally:
        await client.aclose()


def _redis_location(url: str) -> str:
    """A Redis URL without its password (ValueError when its port does not parse)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _check_webhook_settings(settings: Settings) -> None:
    """SABRE_WEBHOOK_URLS and SABRE_WEBHOOK_ALLOW parse, or the service does not start."""
    try:
        webhooks.default_webhook_urls(settings)
        webhooks.webhook_policy(settings)
    except ValueError as exc:
        raise StartupError(str(exc)) from None


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
