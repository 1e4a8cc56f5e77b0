"""Shared fixtures: the stores (SQLite always; PostgreSQL and Redis when configured), the scripted
LLM, and an app served over HTTP semantics.

PostgreSQL and Redis come from ``SABRE_TEST_DATABASE_URL`` and ``SABRE_TEST_REDIS_URL``. Without them
their tests are skipped on a developer machine; with ``SABRE_TEST_REQUIRE_SERVICES=1`` (what ``.ci/run``
sets) a missing or unreachable service fails the run instead of skipping it.
"""

from __future__ import annotations

import asyncio
import compileall
import fnmatch
import gc
import os
import secrets
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis
from sqlalchemy import text, update
from xdist.scheduler import LoadFileScheduling

from app.config import Settings
from app.kit.clock import utcnow
from app.kit.db import create_engine
from app.kit.migrate import upgrade
from app.llm.scripted import ScriptedLLM
from app.main import create_app
from app.models import Turn

PG_URL = os.environ.get("SABRE_TEST_DATABASE_URL", "")
REDIS_URL = os.environ.get("SABRE_TEST_REDIS_URL", "")
REQUIRE = os.environ.get("SABRE_TEST_REQUIRE_SERVICES") == "1"
# litellm (a client in tests/openai_compat) fetches its model price list from GitHub when imported,
# three tries 2-5 s apart where the machine has no network, before it falls back to the copy it
# ships: its own copy at once. What the tests ask of litellm does not depend on prices.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


# The files whose tests take longest in all (servers started and killed, a fuzzer, timeouts waited
# out), heaviest first: xdist hands files to its workers in collection order (the README's command
# turns its reordering by test count off), so these start first and no worker is left, at the end,
# running one of them alone while the others wait. A name missing here only loses that place.
HEAVY_FIRST = (
    "tests/api/test_schemathesis.py",
    "tests/tools/test_mcp.py",
    "tests/conversations/test_external_tools.py",
    "tests/conversations/test_idempotency_lease.py",
    "tests/events/test_turn_operations.py",
    "tests/kit/test_observability.py",
    "tests/events/test_webhooks.py",
    "tests/runtime/test_limits.py",
    "tests/openai_compat/test_chat_completions.py",
    "tests/kit/test_jobs.py",
    "tests/conversations/test_turns.py",
    "tests/conversations/test_hostile_input.py",
)


ROOT = Path(__file__).resolve().parents[1]
# The sources the suite's processes import that no installer compiles (uv compiles the
# environment's packages only): the service, the editable workspace packages (the SDK, the SWE-bench
# runner), the benchmarks some tests import and the tests' own helper modules.
UNCOMPILED = ("app", "bench", "clients/python", "integrations/swebench/src", "tests")


def pytest_configure(config: pytest.Config) -> None:
    """Before any test process starts (in xdist's controller, or the only process): write the
    bytecode every process of the suite reads. Where ``PYTHONDONTWRITEBYTECODE`` is set (these
    machines set it), nothing else ever writes it, so every ``sabre serve``, worker and sandbox
    process the suite starts compiled the modules it imports (0.3-0.9 s of CPU for the app, 0.1 s
    for a sandbox worker), and each of the five test processes rewrote the asserts of every test
    module (3 s of CPU each). Up to date, this checks timestamps and hashes only."""
    if hasattr(config, "workerinput"):
        return
    rewritten = _RewrittenByPytest(config)
    for directory in UNCOMPILED:  # the test modules are compiled by _cache_rewritten_tests
        compileall.compile_dir(ROOT / directory, quiet=1, workers=0, rx=rewritten)
    _cache_rewritten_tests(config, rewritten)


class _RewrittenByPytest:
    """Whether pytest imports a file with its asserts rewritten: conftest files and test modules
    (by name, ``python_files``). ``search`` is what ``compileall`` calls on the files it skips."""

    def __init__(self, config: pytest.Config) -> None:
        self.patterns = [*config.getini("python_files"), "conftest.py"]

    def search(self, path: str) -> bool:
        return any(fnmatch.fnmatch(os.path.basename(path), pattern) for pattern in self.patterns)


def _cache_rewritten_tests(config: pytest.Config, rewritten: _RewrittenByPytest) -> None:
    """Write pytest's cache of the test modules with their asserts rewritten, which every test
    process reads instead of rewriting them itself; pytest writes it only where bytecode may be
    written. Through pytest's own (private) functions, so the cache is exactly the one it reads;
    should they change, each process rewrites the modules as it did before."""
    if config.getoption("assertmode") != "rewrite":
        return
    try:
        from _pytest.assertion import rewrite

        state = config.stash[rewrite.assertstate_key]
        tail = rewrite.PYC_TAIL
        read, write, rewrite_test = rewrite._read_pyc, rewrite._write_pyc, rewrite._rewrite_test
    except (ImportError, AttributeError, KeyError):
        return
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if not rewritten.search(str(path)):
            continue
        cache = rewrite.get_cache_dir(path)
        pyc = cache / (path.name[:-3] + tail)
        if read(path, pyc) is None and rewrite.try_makedirs(cache):
            source_hash, code = rewrite_test(path, config)
            write(state, code, source_hash, pyc)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Heaviest files first (``HEAVY_FIRST``), the rest in their order; tests keep theirs."""
    rank = {name: index for index, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


# Files whose parameters are independent runs (module fixtures per parameter, nothing shared between
# them): under ``--dist loadfile`` each parameter is a work unit of its own, so they run in different
# processes at once. schemathesis is a minute of CPU per store (its client and the server it drives);
# in one unit one process ran both, one after the other, for a third of the suite's time.
SPLIT_BY_PARAMETER = ("tests/api/test_schemathesis.py",)


class _LoadFileOrParameter(LoadFileScheduling):
    """``--dist loadfile``, except that a ``SPLIT_BY_PARAMETER`` file's tests group by parameter."""

    def _split_scope(self, nodeid: str) -> str:
        file = nodeid.split("::", 1)[0]
        if file in SPLIT_BY_PARAMETER and nodeid.endswith("]"):
            return f"{file}[{nodeid.rsplit('[', 1)[1]}"
        return file


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadFileScheduling | None:
    """The scheduler of ``--dist loadfile`` (the README's command), with ``SPLIT_BY_PARAMETER``."""
    if config.getoption("dist") != "loadfile":
        return None
    return _LoadFileOrParameter(config, log)


def _unavailable(what: str) -> None:
    if REQUIRE:
        pytest.fail(f"{what} is required (SABRE_TEST_REQUIRE_SERVICES=1) but is not available")
    pytest.skip(f"{what} not configured")


def _asyncpg_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


@pytest.fixture(scope="session")
async def postgres_url() -> AsyncIterator[str]:
    """A fresh, migrated PostgreSQL database for this test session, dropped at the end."""
    async with _fresh_postgres() as url:
        yield url


@pytest.fixture
async def own_postgres_url() -> AsyncIterator[str]:
    """A fresh, migrated PostgreSQL database for one test: for ``sabre serve`` processes, whose job
    workers would otherwise run what earlier tests left queued in the session's database (their
    background turns, against this test's scripted model)."""
    async with _fresh_postgres() as url:
        yield url


@pytest.fixture(scope="module")
async def module_postgres_url() -> AsyncIterator[str]:
    """A fresh, migrated PostgreSQL database for one module's ``sabre serve`` or ``sabre worker``
    processes (see ``own_postgres_url``), when they are module-scoped fixtures."""
    async with _fresh_postgres() as url:
        yield url


@asynccontextmanager
async def _fresh_postgres() -> AsyncIterator[str]:
    if not PG_URL:
        _unavailable("PostgreSQL (SABRE_TEST_DATABASE_URL)")
    admin_dsn = _asyncpg_dsn(Settings(database_url=PG_URL).effective_database_url)
    name = f"sabre_test_{secrets.token_hex(4)}"
    try:
        admin = await asyncpg.connect(admin_dsn, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.fail(f"PostgreSQL at {PG_URL} is unreachable: {exc}")
    await admin.execute(f'CREATE DATABASE "{name}"')
    base = admin_dsn.rsplit("/", 1)[0]
    url = f"postgresql+asyncpg://{base.split('://', 1)[1]}/{name}"
    try:
        await upgrade(url)
        yield url
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture(scope="session")
async def redis_url() -> AsyncIterator[str]:
    """The configured Redis, checked to answer."""
    if not REDIS_URL:
        _unavailable("Redis (SABRE_TEST_REDIS_URL)")
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except Exception as exc:
        pytest.fail(f"Redis at {REDIS_URL} is unreachable: {exc}")
    finally:
        await client.aclose()
    return REDIS_URL


@pytest.fixture(scope="session")
async def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated SQLite file shared by the session (ids are random, so tests do not collide)."""
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('store') / 'sabre.db'}"
    await upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> dict[str, str | None]:
    """The two stores every store-backed test runs on: SQLite alone, PostgreSQL with Redis."""
    if request.param == "sqlite":
        return {"database_url": request.getfixturevalue("sqlite_url"), "redis_url": None}
    return {
        "database_url": request.getfixturevalue("postgres_url"),
        "redis_url": request.getfixturevalue("redis_url"),
    }


@pytest.fixture
def served_store(store: dict[str, str | None], request: pytest.FixtureRequest) -> dict[str, str | None]:
    """``store`` for tests that start ``sabre serve`` or ``sabre worker`` processes: on PostgreSQL a
    database of the test's own (see ``own_postgres_url``); SQLite's job queue lives in the process."""
    if store["redis_url"] is None:
        return store
    return {**store, "database_url": request.getfixturevalue("own_postgres_url")}


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    """A scripted OpenAI-compatible server on loopback, fresh for each test."""
    with ScriptedLLM() as server:
        yield server


AppFactory = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def make_client(store: dict[str, str | None], llm: ScriptedLLM, tmp_path: Path) -> AppFactory:
    """Build an app on the test's store and scripted LLM; settings can be overridden per call."""

    earlier_tests_forgotten = False

    @asynccontextmanager
    async def _make(**overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
        nonlocal earlier_tests_forgotten
        if not earlier_tests_forgotten:  # once: a test's second app takes over from its first
            earlier_tests_forgotten = True
            assert store["database_url"] is not None
            await _forget_earlier_tests(store["database_url"])
        values: dict[str, Any] = {
            "database_url": store["database_url"],
            "redis_url": store["redis_url"],
            "data_dir": tmp_path / "data",
            "openai_base_url": llm.base_url,
            "openai_api_key": "sk-test-secret-key",
            "llm_api": "chat",
            "llm_retry_base_delay": 0.01,
            "llm_max_retries": 1,
            "model": "scripted-model",
            "runtime_workers": 1,
            "runtime_preload": "",
            # Most of the suite's apps run no block: forking workers at their start was a sixth of its time.
            "runtime_lazy_start": True,
            "block_wall_clock_seconds": 10,
        }
        values.update(overrides)
        app = create_app(Settings(**values))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://sabre.test") as client:
                client.app = app  # type: ignore[attr-defined]
                yield client

    return _make


async def _forget_earlier_tests(database_url: str) -> None:
    """End what earlier tests of this process left on the session's shared store that a new app
    would otherwise run, with this test's scripted model: turns still queued or running (its
    recovery sweep hands them out again once queued too long or their lease lapsed) and, on
    PostgreSQL, jobs still queued or left running by an app that closed (its worker takes them,
    a stalled one after SABRE_JOBS_STALLED_SECONDS) and the rows of workers that are gone. No app
    of an earlier test is still open on this store (module-scoped servers have stores of their own)."""
    engine = create_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.execute(
                update(Turn)
                .where(Turn.status.in_(("queued", "running")))
                .values(status="failed", finished_at=utcnow(), lease_owner=None, lease_expires_at=None)
            )
            if not database_url.startswith("sqlite"):
                for statement in (
                    "DELETE FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
                    "DELETE FROM procrastinate_workers",
                ):
                    await connection.execute(text(statement))
    finally:
        await engine.dispose()


@pytest.fixture
async def client(make_client: AppFactory) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app with default test settings."""
    async with make_client() as c:
        yield c


@pytest.fixture(autouse=True)
def _no_tracing_left_on() -> Iterator[None]:
    """A test must not leave this process exporting traces: OpenTelemetry's batch processor restarts
    its export thread in every later fork of the process, and a forked child that confines itself
    with Landlock (tests/runtime) then finds a thread it did not start."""
    yield
    from app.kit import tracing

    if tracing.enabled():
        tracing.stop_tracing()
        pytest.fail("the test left tracing on (an app that did not stop it, or a test that started it)")


@pytest.fixture(autouse=True)
def _asyncio_tasks_dumped_before_a_timeout(request: pytest.FixtureRequest) -> Iterator[None]:
    """pytest-timeout prints threads, and a hung coroutine shows there only as the event loop
    waiting: shortly before the timeout, print every task of a running loop with its awaits."""
    timeout = float(request.config.getini("timeout") or 0)
    if timeout <= 0:
        yield
        return
    finished = threading.Event()
    watcher = threading.Thread(
        target=_dump_tasks_unless, args=(finished, timeout * 0.9), name="task-dump", daemon=True
    )
    watcher.start()
    yield
    finished.set()


def _dump_tasks_unless(finished: threading.Event, after: float) -> None:
    if finished.wait(after):
        return
    loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()]
    lines = [f"+++ still running after {after:.0f} s: the asyncio tasks +++"]
    for loop in loops:
        for task in list(asyncio.all_tasks(loop)):
            lines.append(f"--- {task.get_name()}")
            awaited: Any = task.get_coro()
            while awaited is not None:
                frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
                if frame is not None:
                    lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
                awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    print("\n".join(lines), file=sys.stderr, flush=True)
