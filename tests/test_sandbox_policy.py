"""The sandbox is never silently weaker than configured, and what SABRE keeps on disk is private.

``SABRE_SANDBOX=auto`` on a machine where bubblewrap cannot run: a server with API keys (static
or stored) or on a non-loopback address refuses to start, saying why and how to fix it; a keyless
loopback-only server falls back to the process backend, loudly. ``/readyz`` and the start-up line
name the sandbox in force. The data directory is 0700 and the SQLite store 0600.

"Bubblewrap cannot run here" is a ``SABRE_BWRAP_PATH`` that fails the way bwrap does on a kernel
without unprivileged user namespaces: the real seam an operator has, no patching.
"""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog

from app.auth.service import create_key
from app.config import Settings
from app.kit.db import create_engine, create_sessionmaker
from app.kit.migrate import upgrade
from app.llm.scripted import ScriptedLLM
from app.main import StartupError, create_app

NO_USERNS = "No permissions to create new namespace"


@pytest.fixture
def broken_bwrap(tmp_path: Path) -> Path:
    """A bwrap that fails as it does where the kernel refuses unprivileged user namespaces."""
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho 'bwrap: {NO_USERNS}' >&2\nexit 1\n")
    fake.chmod(0o755)
    return fake


def _settings(tmp_path: Path, llm: ScriptedLLM, **overrides: Any) -> Settings:
    """Settings of a server on the embedded store under ``tmp_path/data`` (as by default)."""
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "database_url": None,
        "redis_url": None,
        "openai_base_url": llm.base_url,
        "openai_api_key": "sk-test-secret-key",
        "llm_api": "chat",
        "model": "scripted-model",
        "runtime_workers": 1,
        "runtime_preload": "",
    }
    values.update(overrides)
    return Settings(**values)


@asynccontextmanager
async def _serve(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan with ``settings`` and talk to it over HTTP."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sabre.test") as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


async def _refusal(settings: Settings) -> str:
    """The StartupError message of a server that must not start."""
    with pytest.raises(StartupError) as raised:
        async with _serve(settings):
            pytest.fail("the server started")
    return str(raised.value)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- auto never falls back when others can reach the server ------------------------------------


async def test_auto_with_static_keys_and_no_bubblewrap_refuses_to_start(
    tmp_path: Path, llm: ScriptedLLM, broken_bwrap: Path
) -> None:
    settings = _settings(tmp_path, llm, api_keys="acme:sk-acme-key", bwrap_path=broken_bwrap)
    message = await _refusal(settings)
    assert NO_USERNS in message  # the probe's reason
    assert "API keys are configured" in message  # why that stops the service
    assert "unprivileged_userns_clone" in message  # how to fix it
    assert "systempaths=unconfined" in message
    assert "SABRE_SANDBOX=process" in message


async def test_auto_with_stored_keys_and_no_bubblewrap_refuses_to_start(
    tmp_path: Path, llm: ScriptedLLM, broken_bwrap: Path
) -> None:
    settings = _settings(tmp_path, llm, bwrap_path=broken_bwrap)
    await upgrade(settings.effective_database_url)
    engine = create_engine(settings.effective_database_url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            await create_key(session, tenant="acme")
    finally:
        await engine.dispose()
    message = await _refusal(settings)
    assert NO_USERNS in message
    assert "API keys are configured" in message


async def test_auto_on_a_non_loopback_address_and_no_bubblewrap_refuses_to_start(
    tmp_path: Path, llm: ScriptedLLM, broken_bwrap: Path
) -> None:
    # Keys are needed to bind beyond loopback at all; the address is named as a reason of its own.
    settings = _settings(tmp_path, llm, host="0.0.0.0", api_keys="acme:sk-acme-key", bwrap_path=broken_bwrap)
    message = await _refusal(settings)
    assert NO_USERNS in message
    assert "SABRE_HOST=0.0.0.0 is not a loopback address" in message


async def test_explicit_bwrap_that_cannot_run_refuses_to_start_saying_how_to_fix_it(
    tmp_path: Path, llm: ScriptedLLM, broken_bwrap: Path
) -> None:
    settings = _settings(tmp_path, llm, sandbox="bwrap", bwrap_path=broken_bwrap)
    message = await _refusal(settings)
    assert NO_USERNS in message
    assert "unprivileged_userns_clone" in message


async def test_process_named_explicitly_runs_with_keys(
    tmp_path: Path, llm: ScriptedLLM, broken_bwrap: Path
) -> None:
    settings = _settings(
        tmp_path, llm, sandbox="process", api_keys="acme:sk-acme-key", bwrap_path=broken_bwrap
    )
    async with _serve(settings) as client:
        ready = (await client.get("/readyz")).json()
    assert ready["sandbox"] == "process"


# -- open loopback-only mode falls back, loudly ------------------------------------------------


async def test_auto_in_open_loopback_mode_falls_back_to_process_with_a_warning(
    tmp_path: Path, llm: ScriptedLLM, broken_bwrap: Path
) -> None:
    settings = _settings(tmp_path, llm, bwrap_path=broken_bwrap)
    with structlog.testing.capture_logs() as logs:
        async with _serve(settings) as client:
            ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ok", "checks": {"store": "ok"}, "sandbox": "process"}
    warnings = {e["event"]: e for e in logs if e["log_level"] == "warning"}
    assert NO_USERNS in warnings["sandbox_without_namespaces"]["reason"]
    assert NO_USERNS in warnings["sandbox_fallback_to_process"]["reason"]
    started = next(e for e in logs if e["event"] == "sabre_started")
    assert started["sandbox"] == "process"
    assert NO_USERNS in started["sandbox_reason"]


# -- the sandbox in force is visible -------------------------------------------------------------


async def test_readyz_and_the_start_up_line_name_the_sandbox(tmp_path: Path, llm: ScriptedLLM) -> None:
    with structlog.testing.capture_logs() as logs:
        async with _serve(_settings(tmp_path, llm)) as client:
            body = (await client.get("/readyz")).json()
            in_force = client.app.state.pool.sandbox  # type: ignore[attr-defined]
    assert body["sandbox"] == in_force
    assert in_force in ("bwrap", "process")
    started = next(e for e in logs if e["event"] == "sabre_started")
    assert started["sandbox"] == in_force
    # A reason is given exactly when auto fell back.
    assert ("sandbox_reason" in started) == (in_force == "process")


# -- owner-only files ----------------------------------------------------------------------------


async def test_data_dir_is_0700_and_the_store_0600_after_start(tmp_path: Path, llm: ScriptedLLM) -> None:
    settings = _settings(tmp_path, llm)
    async with _serve(settings) as client:
        assert (await client.get("/readyz")).status_code == 200
        database = settings.data_dir / "sabre.db"
        store_files = [database, *(database.with_name(database.name + s) for s in ("-wal", "-shm"))]
        assert [f for f in store_files if f.exists()] == store_files  # WAL mode: all three exist
        assert {f.name: _mode(f) for f in store_files} == {f.name: 0o600 for f in store_files}
    assert _mode(settings.data_dir) == 0o700
    assert settings.workspaces_dir.is_dir()


async def test_a_loose_data_dir_and_store_are_tightened(tmp_path: Path, llm: ScriptedLLM) -> None:
    settings = _settings(tmp_path, llm)
    settings.data_dir.mkdir(mode=0o755)
    settings.data_dir.chmod(0o755)
    database = settings.data_dir / "sabre.db"
    await upgrade(settings.effective_database_url)
    database.chmod(0o644)
    with structlog.testing.capture_logs() as logs:
        async with _serve(settings) as client:
            assert (await client.get("/readyz")).status_code == 200
    assert _mode(settings.data_dir) == 0o700
    assert _mode(database) == 0o600
    tightened = [e for e in logs if e["event"] == "data_dir_tightened"]
    assert [(e["was"], e["now"]) for e in tightened] == [("0o755", "0o700")]


async def test_sabre_keys_create_makes_a_private_store(tmp_path: Path) -> None:
    """The store can be made before the server ever starts (``sabre keys create``): it is
    private from its first byte, its directory too."""
    data = tmp_path / "fresh" / "data"
    await upgrade(f"sqlite+aiosqlite:///{data / 'sabre.db'}")
    assert _mode(data) == 0o700
    assert _mode(data / "sabre.db") == 0o600
