"""Tenants' places in a queue's line (app.kit.jobs: start-time fair queuing), on the real job
engine over both stores, with no worker: the test takes jobs itself, as a worker does
(``fetch_job``, highest priority first, then oldest) and ends them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import procrastinate
import pytest
from procrastinate import App

from app.config import Settings
from app.kit import jobs
from tests.conftest import _forget_earlier_tests

blueprint = procrastinate.Blueprint()


@blueprint.task(name="line_probe", queue="webhooks")
async def line_probe(tenant: str, name: str) -> None:
    """Never run: the test takes its jobs itself."""


@pytest.fixture
async def job_app(store: dict[str, str | None], tmp_path: Path) -> AsyncIterator[App]:
    """A job app on each store, with nothing earlier tests left waiting or running."""
    assert store["database_url"] is not None
    await _forget_earlier_tests(store["database_url"])
    settings = Settings(database_url=store["database_url"], data_dir=tmp_path)
    app = jobs.build_job_app(settings, blueprints=[blueprint])
    await app.open_async()
    try:
        yield app
    finally:
        await app.close_async()


class Line:
    """One queue's line worked by hand, as a worker of one slot does: the job it took runs (is
    doing) until it takes the next."""

    def __init__(self, app: App, worker_id: int) -> None:
        self.app = app
        self.worker_id = worker_id
        self.queued = 0
        self.served: list[str] = []
        self.running: procrastinate.jobs.Job | None = None

    async def queue(self, tenant: str) -> None:
        self.queued += 1
        await jobs.defer(
            self.app, "line_probe", queue="webhooks", tenant=tenant, name=f"{tenant}{self.queued}"
        )

    async def take_next(self) -> None:
        """End the running job, and take the next in line."""
        if self.running is not None:
            done = procrastinate.jobs.Status.SUCCEEDED
            await self.app.job_manager.finish_job(self.running, status=done, delete_job=True)
        self.running = await self.app.job_manager.fetch_job(queues=["webhooks"], worker_id=self.worker_id)
        assert self.running is not None, "the line is empty"
        self.served.append(str(self.running.task_kwargs["tenant"]))

    async def waiting(self, tenant: str) -> int:
        listed = await self.app.job_manager.list_jobs_async(queue="webhooks")
        return sum(1 for job in listed if job.task_kwargs["tenant"] == tenant and job.status == "todo")


async def test_a_tenant_that_keeps_queueing_cannot_hold_back_another_tenants_backlog(job_app: App) -> None:
    """Globex queues four jobs; acme queues one each time it has none waiting, as a steady client
    does. Globex's backlog is served every other job. Before (a job's priority was minus its
    tenant's jobs waiting or running), each new acme job took priority -1, ahead of globex's
    third and fourth, for as long as acme kept it up."""
    line = Line(job_app, await job_app.job_manager.register_worker())
    for _ in range(4):
        await line.queue("globex")
    for _ in range(8):
        if not await line.waiting("acme"):
            await line.queue("acme")
        await line.take_next()
    assert line.served == ["globex", "acme"] * 4


async def test_a_backlog_waits_behind_another_tenants_first_job(job_app: App) -> None:
    line = Line(job_app, await job_app.job_manager.register_worker())
    for _ in range(3):
        await line.queue("acme")
    await line.take_next()  # acme's first runs
    await line.queue("globex")
    for _ in range(3):
        await line.take_next()
    assert line.served == ["acme", "globex", "acme", "acme"]


async def test_the_embedded_store_keeps_nothing_of_jobs_that_are_gone(tmp_path: Path) -> None:
    """A long-lived embedded server runs jobs for weeks: the store keeps no log of its queries and
    nothing of a job once it is deleted (before: procrastinate's in-memory store, a test double,
    kept every query, polls and heartbeats included, and every deleted job's events)."""
    settings = Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", data_dir=tmp_path)
    app = jobs.build_job_app(settings, blueprints=[blueprint])
    connector = app.connector
    assert isinstance(connector, jobs.EmbeddedConnector)
    await app.open_async()
    try:
        line = Line(app, await app.job_manager.register_worker())
        for _ in range(50):
            await line.queue("acme")
            await line.take_next()
        await app.job_manager.delete_old_jobs(nb_hours=0, include_failed=True)
    finally:
        await app.close_async()
    assert len(connector.jobs) == 1  # the last one taken, still running
    assert connector.queries == []
    assert connector.events.keys() == connector.jobs.keys()
