"""The job engine (app.kit.jobs): jobs the API defers run on a worker process, or on the worker
`sabre serve` runs itself; a worker killed mid-job has its job run again by another once its
heartbeat is stale; a worker stopped by SIGTERM puts its running job back; `sabre worker` refuses
the embedded store."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.kit import jobs as jobs_module
from app.kit.jobs import add_blueprint, defer, psycopg_conninfo
from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory
from tests.kit import marker as marker_task

ROOT = Path(__file__).resolve().parents[2]


def worker_env(*, database_url: str | None, llm: ScriptedLLM, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a worker process on the test's store (a data directory of its own)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "SABRE_DATA_DIR": str(tmp_path / "worker-data"),
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": "sk-test",
        "SABRE_LLM_API": "chat",
        "SABRE_MODEL": "scripted-model",
        "SABRE_RUNTIME_WORKERS": "1",
        "SABRE_RUNTIME_PRELOAD": "",
        "SABRE_RUNTIME_LAZY_START": "true",
        **extra,
    }
    if database_url is not None:
        env["SABRE_DATABASE_URL"] = database_url
    return env


@contextmanager
def process(args: list[str], *, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child process in a session of its own (so a kill takes all of it), its output in ``log``;
    stopped at the end if still running."""
    with log.open("ab") as out:
        child = subprocess.Popen(
            [sys.executable, *args], env=env, cwd=ROOT, stdout=out, stderr=out, start_new_session=True
        )
    try:
        yield child
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=10)


async def eventually(check: Callable[[], bool], *, within: float, what: str, log: Path | None = None) -> None:
    """Wait until ``check()`` holds, at most ``within`` seconds."""
    for _ in range(int(within * 10)):
        if check():
            return
        await asyncio.sleep(0.1)
    detail = _tail(log)
    raise AssertionError(f"not within {within} s: {what}{detail}")


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return f"\n--- worker output ---\n{log.read_text()[-4000:]}"


def runs(path: Path) -> list[list[str]]:
    """The marker task's lines: ``[start|end, pid, attempts, ...]``."""
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_conninfo_from_the_sqlalchemy_url() -> None:
    assert (
        psycopg_conninfo("postgresql+asyncpg://sabre:p%40ss@db.example:5433/sabre?ssl=require")
        == "postgresql://sabre:p%40ss@db.example:5433/sabre?sslmode=require"
    )


async def test_the_worker_of_the_api_process_runs_jobs(make_client: AppFactory, tmp_path: Path) -> None:
    """On both stores `sabre serve` runs a worker (SQLite: always; PostgreSQL: by default), and a
    task gets the process's Resources."""
    marker = tmp_path / "runs.txt"
    async with make_client() as client:
        jobs = client.app.state.jobs  # type: ignore[attr-defined]
        add_blueprint(jobs, marker_task.blueprint)
        await defer(jobs, "test_marker", queue="turns", path=str(marker))
        await eventually(lambda: any(r[0] == "end" for r in runs(marker)), within=15, what="the job ran")
    start, end = runs(marker)
    assert start == ["start", str(os.getpid()), "0", str(tmp_path / "data")]
    assert end == ["end", str(os.getpid()), "0"]


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_job_the_api_defers_runs_on_sabre_worker(
    make_client: AppFactory, own_postgres_url: str, llm: ScriptedLLM, tmp_path: Path
) -> None:
    marker, log = tmp_path / "runs.txt", tmp_path / "worker.log"
    env = worker_env(database_url=own_postgres_url, llm=llm, tmp_path=tmp_path)
    async with make_client(worker_in_serve=False, database_url=own_postgres_url) as client:
        with process(["-m", "tests.kit.job_worker"], env=env, log=log) as worker:
            await defer(client.app.state.jobs, "test_marker", queue="turns", path=str(marker))  # type: ignore[attr-defined]
            await eventually(
                lambda: len(runs(marker)) == 2, within=30, what="the worker ran the job", log=log
            )
            assert [r[:3] for r in runs(marker)] == [
                ["start", str(worker.pid), "0"],
                ["end", str(worker.pid), "0"],
            ]
            assert runs(marker)[0][3] == str(tmp_path / "worker-data")  # the worker's own Resources


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_job_of_a_killed_worker_runs_again_on_another(
    make_client: AppFactory, own_postgres_url: str, llm: ScriptedLLM, tmp_path: Path
) -> None:
    marker, log = tmp_path / "runs.txt", tmp_path / "worker.log"
    env = worker_env(
        database_url=own_postgres_url,
        llm=llm,
        tmp_path=tmp_path,
        SABRE_JOBS_STALLED_SECONDS="2",
        SABRE_JOBS_STALLED_CHECK_SECONDS="1",
    )
    async with make_client(worker_in_serve=False, database_url=own_postgres_url) as client:
        with process(["-m", "tests.kit.job_worker"], env=env, log=log) as first:
            await defer(
                client.app.state.jobs,  # type: ignore[attr-defined]
                "test_marker",
                queue="turns",
                path=str(marker),
                first_sleep=120,
            )
            await eventually(
                lambda: len(runs(marker)) == 1, within=30, what="the first worker took the job", log=log
            )
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
        with process(["-m", "tests.kit.job_worker"], env=env, log=log) as second:
            # The second worker finds the job of a worker silent for 2 s and runs it again.
            await eventually(
                lambda: len(runs(marker)) == 3, within=40, what="another worker ran the job again", log=log
            )
            assert [r[:3] for r in runs(marker)] == [
                ["start", str(first.pid), "0"],
                ["start", str(second.pid), "1"],
                ["end", str(second.pid), "1"],
            ]


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_sigterm_puts_a_running_job_back_for_another_worker(
    make_client: AppFactory, own_postgres_url: str, llm: ScriptedLLM, tmp_path: Path
) -> None:
    """A worker asked to stop gives its job the grace period, then puts it back on the queue: the
    next worker runs it at once, long before a stall would have been noticed (60 s here)."""
    marker, log = tmp_path / "runs.txt", tmp_path / "worker.log"
    env = worker_env(
        database_url=own_postgres_url,
        llm=llm,
        tmp_path=tmp_path,
        SABRE_WORKER_SHUTDOWN_SECONDS="0.5",
        SABRE_JOBS_STALLED_SECONDS="60",
    )
    async with make_client(worker_in_serve=False, database_url=own_postgres_url) as client:
        with process(["-m", "tests.kit.job_worker"], env=env, log=log) as first:
            await defer(
                client.app.state.jobs,  # type: ignore[attr-defined]
                "test_marker",
                queue="turns",
                path=str(marker),
                first_sleep=120,
            )
            await eventually(
                lambda: len(runs(marker)) == 1, within=30, what="the first worker took the job", log=log
            )
            first.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(first.wait, 15) == 0
        with process(["-m", "tests.kit.job_worker"], env=env, log=log) as second:
            await eventually(lambda: len(runs(marker)) == 3, within=20, what="the job ran again", log=log)
            assert [r[:3] for r in runs(marker)][1:] == [
                ["start", str(second.pid), "1"],
                ["end", str(second.pid), "1"],
            ]


def test_sabre_worker_refuses_the_embedded_store(llm: ScriptedLLM, tmp_path: Path) -> None:
    env = worker_env(database_url=None, llm=llm, tmp_path=tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "worker"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "sabre worker needs PostgreSQL" in done.stderr
    assert "inside the `sabre serve` process" in done.stderr


async def test_the_maintenance_tasks_run(make_client: AppFactory) -> None:
    """The periodic tasks every worker defers (stalled jobs, old failed jobs) run cleanly when
    there is nothing to do; succeeded jobs are deleted as they end."""
    async with make_client() as client:
        jobs = client.app.state.jobs  # type: ignore[attr-defined]
        ids = {
            await defer(jobs, "retry_stalled_jobs", queue="maintenance", timestamp=0),
            await defer(jobs, "remove_old_jobs", queue="maintenance", timestamp=0),
        }

        async def left() -> list[object]:
            return [
                job for job in await jobs.job_manager.list_jobs_async(queue="maintenance") if job.id in ids
            ]

        for _ in range(100):
            if not await left():
                break
            await asyncio.sleep(0.1)
        assert await left() == []


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)  # the job runs in this process
async def test_a_job_that_ignores_cancellation_does_not_hold_the_shutdown(
    make_client: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process stops its worker: the job gets SABRE_WORKER_SHUTDOWN_SECONDS, is then cancelled
    and ignores it; the shutdown goes on after the margin instead of waiting for it forever."""
    monkeypatch.setattr(jobs_module, "STOP_MARGIN_SECONDS", 0.5)
    marker_task.RELEASE.clear()
    marker_task.STARTED.clear()
    try:
        async with make_client(worker_shutdown_seconds=0.2) as client:
            jobs = client.app.state.jobs  # type: ignore[attr-defined]
            add_blueprint(jobs, marker_task.blueprint)
            await defer(jobs, "test_stubborn", queue="turns")
            await eventually(marker_task.STARTED.is_set, within=15, what="the job started")
            closing = time.monotonic()
        waited = time.monotonic() - closing
        assert waited < 5, f"the shutdown waited {waited:.1f} s for a job that never ends"
    finally:
        marker_task.RELEASE.set()  # the job (and the worker left waiting on it) ends now
    for _ in range(50):
        stuck = [t for t in asyncio.all_tasks() if t.get_name() == "sabre job worker"]
        if not stuck:
            break
        await asyncio.sleep(0.1)
    assert not stuck


async def test_a_worker_that_loses_its_cancellation_is_not_started_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process closes its worker and the cancellation is lost in a driver's call (the worker
    returns as if it had stopped on its own): no new worker starts on the closing app."""
    monkeypatch.setattr(jobs_module, "STOP_MARGIN_SECONDS", 0.5)
    started = 0

    async def a_worker_that_loses_its_cancellation(*args: object, **kwargs: object) -> None:
        nonlocal started
        started += 1
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return  # lost: as if the worker had stopped on its own

    monkeypatch.setattr(jobs_module, "run_worker", a_worker_that_loses_its_cancellation)
    resources = SimpleNamespace(settings=SimpleNamespace(worker_concurrency=1, worker_shutdown_seconds=0.0))
    async with jobs_module.worker_in_process(None, resources=resources):  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.5)  # the supervisor's first pause before a restart is 1 s
    stuck = [t for t in asyncio.all_tasks() if t.get_name() == "sabre job worker"]
    for task in stuck:
        task.cancel()  # before: a second worker, started after the close, waits here
    assert started == 1
    assert not stuck
