"""Start-up refusals (no model, no keys off loopback, a store or Redis that cannot be used, a schema
behind the code) say why in one line; `sabre migrate` runs one upgrade at a time per database, the
others waiting for it; empty optional settings are unset ones (compose passes ``KEY: ''``)."""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pydantic import ValidationError

from app.config import Settings
from app.kit.migrate import MIGRATION_LOCK_KEY, upgrade
from app.main import StartupError, create_app
from app.personas.models import Limits as PersonaOverrides
from app.personas.schemas import PersonaLimits
from app.runtime import Limits
from tests.conftest import PG_URL, _asyncpg_dsn, _unavailable

ROOT = Path(__file__).resolve().parents[1]


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "database_url": None,
        "redis_url": None,
        "openai_base_url": "http://127.0.0.1:9/v1",
        "openai_api_key": None,
        "runtime_workers": 1,
        "runtime_preload": "",
    }
    values.update(overrides)
    return Settings(**values)


async def _refusal(settings: Settings) -> str:
    """The StartupError message of a server that must not start (before its sandbox starts)."""
    app = create_app(settings)
    with pytest.raises(StartupError) as raised:
        async with app.router.lifespan_context(app):
            pytest.fail("the server started")
    message = str(raised.value)
    assert "\n" not in message
    return message


@pytest.fixture
async def fresh_database() -> AsyncIterator[str]:
    """An empty PostgreSQL database (no schema), dropped at the end."""
    if not PG_URL:
        _unavailable("PostgreSQL (SABRE_TEST_DATABASE_URL)")
    admin_dsn = _asyncpg_dsn(Settings(database_url=PG_URL).effective_database_url)
    name = f"sabre_startup_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_dsn, timeout=5)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{admin_dsn.rsplit('/', 1)[0]}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def test_empty_optional_settings_are_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "SABRE_DATABASE_URL", "SABRE_REDIS_URL"):
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("SABRE_BROWSER_EXECUTABLE", "  ")
    settings = Settings()
    assert settings.openai_api_key is None
    assert settings.openai_base_url is None
    assert settings.database_url is None
    assert settings.redis_url is None
    assert settings.browser_executable is None
    # An empty list-like setting keeps its meaning (no modules to preload).
    monkeypatch.setenv("SABRE_RUNTIME_PRELOAD", "")
    assert Settings().preload_modules == ()


def test_block_limits_are_one_concept() -> None:
    """The service's block limits (SABRE_BLOCK_<NAME>), a persona's overrides and the persona API
    name exactly the runtime's Limits fields: a limit added to one is added to all."""
    fields = set(Limits.model_fields)
    assert {
        name.removeprefix("block_") for name in Settings.model_fields if name.startswith("block_")
    } == fields
    assert set(PersonaOverrides.model_fields) == fields
    assert set(PersonaLimits.model_fields) == fields
    assert Settings(block_disk_files=7).block_limits == Limits(disk_files=7)


@pytest.mark.parametrize(
    ("variable", "value"),
    [("SABRE_BLOCK_CPU_SECONDS", "0"), ("SABRE_BLOCK_MEMORY_MB", "-1"), ("SABRE_BLOCK_STDOUT_BYTES", "0")],
)
def test_a_block_limit_the_runtime_refuses_is_a_start_up_error(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """Not a failure of every turn later: the setting is named when the service starts."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert variable in str(caught.value)


async def test_no_model_refuses_to_start(tmp_path: Path) -> None:
    message = await _refusal(_settings(tmp_path, openai_base_url=None, openai_api_key="  "))
    assert message.startswith("No model is configured: set OPENAI_API_KEY")
    # A local server needs no key; OpenAI with a key needs no base URL.
    await _refusal_not_about_model(_settings(tmp_path, openai_api_key=None))
    await _refusal_not_about_model(_settings(tmp_path, openai_base_url=None, openai_api_key="sk-x"))


async def _refusal_not_about_model(settings: Settings) -> None:
    """Past the model check, a bad Redis URL stops the start instead: so the model was accepted."""
    message = await _refusal(settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"}))
    assert message.startswith("Redis at redis://127.0.0.1:1/0 cannot be reached")


async def test_a_store_that_cannot_be_reached_refuses_in_one_line(tmp_path: Path) -> None:
    url = "postgresql://sabre:hunter2-secret@127.0.0.1:1/sabre"
    message = await _refusal(_settings(tmp_path, database_url=url))
    assert message.startswith("The store at postgresql+asyncpg://sabre:***@127.0.0.1:1/sabre cannot be used")
    assert "hunter2" not in message
    assert "Check SABRE_DATABASE_URL" in message
    bad_scheme = await _refusal(_settings(tmp_path, database_url="mysql://root@db/sabre"))
    assert bad_scheme.startswith("The store at mysql://root@db/sabre cannot be used")


async def test_a_data_directory_that_cannot_be_written_refuses(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    message = await _refusal(_settings(tmp_path, data_dir=blocker / "data"))
    assert message.startswith(f"The data directory {blocker / 'data'} cannot be used")


async def test_a_schema_behind_the_code_refuses_to_start(tmp_path: Path, fresh_database: str) -> None:
    settings = _settings(tmp_path, database_url=fresh_database)
    message = await _refusal(settings)
    assert "is not ready: its schema is at no SABRE schema" in message
    assert "run `sabre migrate` first" in message


async def test_concurrent_migrations_run_one_at_a_time(fresh_database: str) -> None:
    url = Settings(database_url=fresh_database).effective_database_url
    # Replicas started together: without the lock they race on CREATE TABLE and all but one fail.
    await asyncio.wait_for(asyncio.gather(*(upgrade(url) for _ in range(3))), timeout=60)
    connection = await asyncpg.connect(fresh_database, timeout=5)
    try:
        assert len(await connection.fetch("SELECT version_num FROM alembic_version")) == 1
    finally:
        await connection.close()


async def test_a_migration_that_loses_the_lock_waits_for_the_winner(fresh_database: str) -> None:
    url = Settings(database_url=fresh_database).effective_database_url
    holder = await asyncpg.connect(fresh_database, timeout=5)
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        waiting = asyncio.create_task(upgrade(url))
        for _ in range(200):  # until the upgrade waits on the lock (it never gets past it)
            blocked = await holder.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            if blocked:
                break
            assert not waiting.done(), waiting
            await asyncio.sleep(0.05)
        assert blocked == 1
        assert not await holder.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL")
        await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
        await asyncio.wait_for(waiting, timeout=60)
        assert await holder.fetchval("SELECT count(*) FROM alembic_version") == 1
    finally:
        await holder.close()


def _sabre(*args: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SABRE_DATA_DIR": str(tmp_path / "data")}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env={**base, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_sabre_serve_refuses_in_one_line(tmp_path: Path) -> None:
    """What `docker run` without keys shows: one line (a JSON log line here), a non-zero status."""
    done = _sabre(
        "serve",
        env={"SABRE_HOST": "0.0.0.0", "SABRE_PORT": "1", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
        tmp_path=tmp_path,
    )
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 3, lines
    assert len(lines) == 1, lines
    assert "startup_refused" in lines[0]
    assert "No API keys are configured" in lines[0]


@pytest.mark.parametrize(
    ("command", "env", "expected"),
    [
        (  # a field's own check comes first; the block limits are checked once the fields pass
            "serve",
            {"SABRE_BLOCK_CPU_SECONDS": "0", "SABRE_RUNTIME_WORKERS": "0", "SABRE_MODEL": "m"},
            "sabre: SABRE_RUNTIME_WORKERS: Input should be greater than or equal to 1",
        ),
        (
            "migrate",
            {"SABRE_BLOCK_CPU_SECONDS": "0"},
            "sabre: SABRE_BLOCK_CPU_SECONDS: Input should be greater than 0",
        ),
    ],
)
def test_a_setting_out_of_range_is_one_line_naming_it(
    tmp_path: Path, command: str, env: dict[str, str], expected: str
) -> None:
    """Any command: a bad SABRE_* value is named in one line per problem, status 2, no traceback."""
    done = _sabre(command, env=env, tmp_path=tmp_path)
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 2, lines
    assert lines == [expected], lines


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@127.0.0.1:1/db", "postgresql+asyncpg://u:***@127.0.0.1:1/db"),
        # Errors the driver raises before connecting (before: a traceback of hundreds of lines).
        ("postgresql://u:pw@127.0.0.1:99999/db", "postgresql+asyncpg://u:***@127.0.0.1:99999/db"),
        ("postgresql://u:pw@127.0.0.1:1/db?sslmode=bogus", "postgresql+asyncpg://u:***@127.0.0.1:1/db"),
    ],
)
def test_sabre_migrate_with_a_bad_url_says_so_in_one_line(tmp_path: Path, url: str, shown: str) -> None:
    done = _sabre("migrate", env={"SABRE_DATABASE_URL": url}, tmp_path=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"The store at {shown}"), line
    assert "pw" not in line


async def test_a_start_that_fails_late_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Everything opened before the failure is closed: the sandbox workers, the store, tracing (a
    tracer left running restarts its export thread in every later fork of the process)."""
    from app.conversations.control import TurnControl
    from app.kit import tracing
    from app.wiring import open_resources

    async def refuse(self: TurnControl) -> None:
        raise RuntimeError("the bus refused the subscription")

    monkeypatch.setattr(TurnControl, "start", refuse)
    settings = _settings(tmp_path, tracing_endpoint="http://127.0.0.1:9/v1/traces")
    before = set(_descendants(os.getpid()))
    with pytest.raises(RuntimeError, match="refused the subscription"):
        async with open_resources(settings):
            pytest.fail("the process started")
    assert not tracing.enabled()
    for _ in range(100):  # the workers are killed; their reaping may take a moment
        if set(_descendants(os.getpid())) <= before:
            break
        await asyncio.sleep(0.05)
    assert set(_descendants(os.getpid())) <= before, "sandbox workers left running"


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc's children lists)."""
    found: list[int] = []
    for child in _children(pid):
        found += [child, *_descendants(child)]
    return found


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(c) for c in listing.read().split()]
    except OSError:
        return []


async def test_a_started_server_keeps_its_start_up_heap_out_of_the_cyclic_gc(tmp_path: Path) -> None:
    """What start-up built is frozen (``gc.freeze``): a full collection under load then scans only
    what requests allocated, not every module and model of the process."""
    gc.unfreeze()  # earlier apps of this test process froze theirs
    assert gc.get_freeze_count() == 0
    app = create_app(_settings(tmp_path, openai_api_key="sk-test"))
    async with app.router.lifespan_context(app):
        assert gc.get_freeze_count() > 10_000
