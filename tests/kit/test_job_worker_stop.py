"""An app's job worker stops when the app closes, however soon after its start: each lane is asked
to stop, not only cancelled (app.kit.jobs.run_worker). A cancellation alone was lost when it landed
in a database call of a lane still starting (psycopg's pool swallows it): that lane ran on, and the
app's close waited for it until SABRE_WORKER_SHUTDOWN_SECONDS + 10 s (30 s by default), about one
close in six on PostgreSQL, and in the test suite at every such close."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from app.config import Settings
from app.llm.scripted import ScriptedLLM
from app.main import create_app
from tests.conftest import _forget_earlier_tests

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
