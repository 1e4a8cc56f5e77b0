"""The ``sabre worker`` process: the resources an API process opens, and a job worker on every
queue until SIGTERM or SIGINT.

On a signal the worker takes no new job and gives its running jobs ``SABRE_WORKER_SHUTDOWN_SECONDS``
to end; a job still running then is cancelled and put back on its queue for another worker
(app.kit.jobs.RequeueOnShutdown). A worker killed outright (SIGKILL, a lost machine) leaves its jobs
to the others, which run them again once its heartbeat is ``SABRE_JOBS_STALLED_SECONDS`` old.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterable

import structlog
from procrastinate import Blueprint

from app.config import Settings
from app.kit.jobs import add_blueprint, run_worker
from app.wiring import StartupError, open_resources

log = structlog.get_logger(__name__)

SQLITE_REFUSAL = (
    "sabre worker needs PostgreSQL: on the embedded SQLite store, jobs live inside the `sabre serve` "
    "process, which runs them itself. Set SABRE_DATABASE_URL=postgresql://… to run separate workers."
)


async def run_worker_process(
    settings: Settings, *, concurrency: int, extra_blueprints: Iterable[Blueprint] = ()
) -> int:
    """Run a worker until a signal stops it; the exit status (0 after a signal, 1 when the worker
    stopped by itself, its database connection lost). ``extra_blueprints``: tasks beyond the
    service's own (tests use it to run tasks of their own)."""
    if settings.is_sqlite:
        raise StartupError(SQLITE_REFUSAL)
    async with open_resources(settings, role="worker") as resources:
        for blueprint in extra_blueprints:
            add_blueprint(resources.jobs, blueprint)
        worker = asyncio.create_task(
            run_worker(resources.jobs, resources=resources, concurrency=concurrency, name="worker"),
            name="sabre job worker",
        )
        stopping = asyncio.Event()

        def stop(signum: signal.Signals) -> None:
            if stopping.is_set():
                log.info("worker_already_stopping", signal=signum.name)
                return
            log.info("worker_stopping", signal=signum.name, grace_seconds=settings.worker_shutdown_seconds)
            stopping.set()
            worker.cancel()

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop, signum)
        try:
            await worker
        except asyncio.CancelledError:
            if not stopping.is_set():
                raise
            log.info("worker_stopped")
            return 0
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        log.error("worker_stopped_unexpectedly", reason="the job worker ended on its own (see the log above)")
        return 1
