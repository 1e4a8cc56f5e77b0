"""An app's job worker stops when the app closes, however soon after its start: each lane is asked
to stop, not only cancelled (app.kit.jobs.run_worker). A cancellation alone was lost when it landed
in a database call of a lane still starting (psycopg's pool swallows it): that lane ran on, and the
app's close waited for it until SABRE_WORKER_SHUTDOWN_SECONDS + 10 s (30 s by default), about one
close in six on PostgreSQL, and in the test suite at every such close."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from app.config import Settings
from app.llm.scripted import ScriptedLLM
from app.main import create_app
from tests.conftest import AppFactory, _forget_earlier_tests

CLOSES = 20
# Far under the stop's own limit (worker_shutdown_seconds, set high below, + 10 s).
CLOSE_WITHIN_SECONDS = 15


async def test_an_app_closed_just_after_its_start_stops_its_job_worker_at_once(
    store: dict[str, str | None], llm: ScriptedLLM, tmp_path: Path
) -> None:
    assert store["database_url"] is not None
    settings = Settings(
        database_url=store["database_url"],
        redis_url=store["redis_url"],
        data_dir=tmp_path / "data",
        openai_base_url=llm.base_url,
        openai_api_key="sk-test",
        llm_api="chat",
        model="scripted-model",
        runtime_workers=1,
        runtime_preload="",
        runtime_lazy_start=True,
        worker_shutdown_seconds=60,
    )
    for _ in range(CLOSES):
        await _forget_earlier_tests(store["database_url"])  # as each test of the suite does first
        app = create_app(settings)
        async with asyncio.timeout(CLOSE_WITHIN_SECONDS):
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://sabre.test") as client:
                    assert (await client.get("/v1/conversations")).status_code == 200


async def test_apps_closed_after_a_request_or_two_lose_no_cancellation(
    store: dict[str, str | None], make_client: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine logs when a side task of a lane (its periodic deferrer) let a cancellation go and
    was cancelled again a second later. With the job store's pool at one connection to start with,
    a lane's first database calls waited for it to grow, a close cancelled them there and lost the
    cancellation: one close in five waited a second for nothing, and now and then one waited 30 s
    for a connection (the pool's timeout). Four connections to start with: none seen since."""
    caplog.set_level(logging.DEBUG, logger="procrastinate.utils")
    assert store["database_url"] is not None
    for _ in range(CLOSES):
        await _forget_earlier_tests(store["database_url"])  # as each test of the suite does first
        async with asyncio.timeout(CLOSE_WITHIN_SECONDS), make_client() as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/v1/conversations/nope")).status_code == 404
    ignored = [r.getMessage() for r in caplog.records if getattr(r, "action", "") == "cancel_task_again"]
    assert ignored == [], ignored
