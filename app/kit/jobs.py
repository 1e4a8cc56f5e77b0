"""The job engine: procrastinate, on the store the service already has.

Domains declare their tasks on a ``procrastinate.Blueprint`` of their own (``app.events.webhooks``,
``app.conversations.background``); ``app.wiring`` lists those blueprints and builds one job app per
process with :func:`build_job_app`. The API process defers jobs with :func:`defer`; a worker
(``sabre worker``, or the one ``sabre serve`` runs in its own process) runs them with the process's
``Resources``, which a task reads with :func:`job_resources`::

    blueprint = procrastinate.Blueprint()

    @blueprint.task(name="run_turn", queue="turns", pass_context=True)
    async def run_turn(context: JobContext, turn_id: str, tenant: str) -> None:
        resources = job_resources(context)
        ...

    await defer(resources.jobs, "run_turn", queue="turns", tenant=tenant, turn_id=turn_id)

Where jobs live:
- PostgreSQL: procrastinate's tables (migration 0005), shared by every process on the store.
  Delivery is at least once: a job runs again when its worker stops heartbeating for
  ``SABRE_JOBS_STALLED_SECONDS`` (killed, frozen, cut off) or shuts down before it ends, so a
  task must be idempotent.
- SQLite (embedded): procrastinate's in-memory store, inside the ``sabre serve`` process that runs
  them; a job still queued or running when that process stops is gone, and the domain that
  deferred it recovers from its own tables (see ``WORKER_STARTUP`` in ``app.wiring``).

Sharing between tenants: a job deferred for a tenant (``defer(..., tenant=...)``) takes a place in
line by start-time fair queuing. The engine runs the highest priority first, then the oldest; a
priority here is minus a virtual time, which advances as jobs start: a tenant's first job gets the
priority of the jobs being served now, and each further job one step below its tenant's last one
waiting or running. So workers take a tenant's first job before another tenant's second, tenants
with backlogs take turns, and a tenant that keeps queueing cannot hold back another's backlog (its
new jobs queue behind its own). Webhooks have slots of their own (``SABRE_WEBHOOK_CONCURRENCY``):
receivers that never answer hold those only, and a retry waits until no first attempt does
(``RETRY_PRIORITY``).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, Final, Literal, cast

import procrastinate
import structlog
from procrastinate import App, BaseRetryStrategy, Blueprint, JobContext, RetryDecision
from procrastinate.app import WorkerOptions
from procrastinate.connector import Notify
from procrastinate.exceptions import ConnectorException
from procrastinate.jobs import Job
from procrastinate.tasks import Task
from procrastinate.testing import InMemoryConnector
from procrastinate.worker import Worker
from sqlalchemy.engine import make_url

from app.config import Settings
from app.kit.periodic import stop as stop_task

if TYPE_CHECKING:
    from app.wiring import Resources

log = structlog.get_logger(__name__)

Queue = Literal["turns", "webhooks", "maintenance"]
# Every worker takes jobs from every queue (one kind of worker to deploy and scale), in two lanes
# of slots: turns and upkeep (SABRE_WORKER_CONCURRENCY), webhooks (SABRE_WEBHOOK_CONCURRENCY).
LANES: Final[tuple[tuple[Queue, ...], tuple[Queue, ...]]] = (("turns", "maintenance"), ("webhooks",))
# How often a worker looks for jobs no notification told it of (retries, scheduled jobs): on the
# embedded store a look at a dict, on PostgreSQL a query.
EMBEDDED_POLL_SECONDS: Final = 0.5
STORE_POLL_SECONDS: Final = 2.0
# Retries wait below every first attempt; fair shares count down to just above it (procrastinate
# stores an int4: after this many jobs served with the queue never empty, the line is first come,
# first served until it empties).
RETRY_PRIORITY: Final = -2_000_000_000
# Where a queue's line stands, for a job of a tenant (PostgreSQL; indexes of migration 0009): the
# priority of the jobs served now (the lowest running; else the highest waiting), and the lowest
# of the tenant's jobs waiting or running. Retries are left out.
_LINE: Final = """
SELECT
    (SELECT min(priority) FROM procrastinate_jobs
     WHERE queue_name = %(queue)s AND status = 'doing' AND priority > %(retry)s) AS serving,
    (SELECT max(priority) FROM procrastinate_jobs
     WHERE queue_name = %(queue)s AND status = 'todo' AND priority > %(retry)s) AS head,
    (SELECT min(priority) FROM procrastinate_jobs
     WHERE queue_name = %(queue)s AND status IN ('todo', 'doing') AND args->>'tenant' = %(tenant)s
       AND priority > %(retry)s) AS own
"""
# Taken (for its transaction) around placing a tenant's job on a queue and inserting it, so that
# concurrent defers of one tenant, in any process, see each other. Two int4 keys: apart from the
# bigint lock of app.kit.migrate.
_SHARE_LOCK: Final = """
SELECT pg_advisory_xact_lock(hashtext('sabre jobs share ' || %(queue)s), hashtext(%(tenant)s))
"""
# The same within this process, before a pool connection is taken: a burst waits here, not
# holding connections the workers need.
_share_locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()
RESOURCES_KEY: Final = "resources"
STALLED_TASK: Final = "retry_stalled_jobs"
CLEANUP_TASK: Final = "remove_old_jobs"
# Succeeded jobs are deleted when they end; failed ones are kept this long for an operator.
KEEP_FAILED_HOURS: Final = 7 * 24
# How much longer than SABRE_WORKER_SHUTDOWN_SECONDS a stopping process waits for its worker (the
# engine's own bookkeeping after the grace period: aborting jobs, unregistering the worker).
STOP_MARGIN_SECONDS: Final = 10.0


def build_job_app(settings: Settings, *, blueprints: Iterable[Blueprint] = ()) -> App:
    """A job app on the configured store (not opened yet: ``await app.open_async()``), with the
    engine's own periodic task and the tasks of ``blueprints``."""
    connector: procrastinate.BaseConnector
    if settings.is_sqlite:
        connector = EmbeddedConnector()
    else:
        connector = procrastinate.PsycopgConnector(
            conninfo=psycopg_conninfo(settings.effective_database_url),
            # One connection per lane stays on LISTEN, the others carry fetches, heartbeats and defers.
            # Four open from the start: a lane whose first calls waited for the pool to grow, closed
            # then (an app closed soon after its start), lost its cancellation there and its close
            # waited a second, or the pool timeout (30 s) for a connection that never came.
            min_size=4,
            max_size=settings.worker_concurrency + settings.webhook_concurrency + 4,
        )
    app = App(connector=connector)
    _add_stalled_jobs_task(app, settings=settings)
    _add_cleanup_task(app)
    for blueprint in blueprints:
        add_blueprint(app, blueprint)
    return app


class EmbeddedConnector(InMemoryConnector):
    """procrastinate's in-memory store, made to serve a long-lived server: its new jobs wake every
    worker listening on it (the engine's keeps one listener, the last to listen, and a worker here
    runs two lanes: the other would only find its jobs at its next poll), and it keeps nothing of
    a job once the job is gone, nor a log of its queries (the engine's, a test double, keeps
    both for ever: every poll and heartbeat of a server running for weeks)."""

    def __init__(self) -> None:
        super().__init__()
        self._listeners: dict[object, tuple[Notify, frozenset[str]]] = {}

    async def generic_execute(
        self, query: str, suffix: Literal["run", "one", "all"], **arguments: Any
    ) -> Any:
        """Run the query, keeping no record of it."""
        try:
            return await super().generic_execute(query, suffix, **arguments)
        finally:
            self.queries.clear()

    async def finish_job_run(self, job_id: int, status: str, delete_job: bool) -> None:
        """End a job; a deleted one's events go with it."""
        await super().finish_job_run(job_id, status, delete_job)
        if delete_job:
            self.events.pop(job_id, None)

    async def delete_old_jobs_run(self, nb_hours: int, queue: str, statuses: Iterable[str]) -> None:
        """Delete old ended jobs, and their events."""
        await super().delete_old_jobs_run(nb_hours, queue, statuses)
        for job_id in self.events.keys() - self.jobs.keys():
            del self.events[job_id]

    async def listen_notify(self, on_notification: Notify, channels: Iterable[str]) -> None:
        """Pass notifications on ``channels`` to ``on_notification`` until cancelled (as on
        PostgreSQL: a stopped lane's listener goes with it)."""
        key = object()
        self._listeners[key] = (on_notification, frozenset(channels))
        self._listening()
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            del self._listeners[key]
            self._listening()

    def _listening(self) -> None:
        """Point the engine's one listener at every lane's."""
        self.notify_channels = sorted(
            {channel for _, channels in self._listeners.values() for channel in channels}
        )
        self.on_notification = self._notify_each if self._listeners else None

    async def _notify_each(self, *, channel: str, payload: str) -> None:
        """Pass a notification to each lane listening on its channel."""
        for on_notification, channels in list(self._listeners.values()):
            if channel in channels:
                await on_notification(channel=channel, payload=payload)


def psycopg_conninfo(database_url: str) -> str:
    """The libpq connection string of a SQLAlchemy PostgreSQL URL (``postgresql+asyncpg://…``):
    the same server, database and credentials; asyncpg's ``ssl`` parameter becomes ``sslmode``."""
    url = make_url(database_url)
    query = dict(url.query)
    if "ssl" in query:
        query.setdefault("sslmode", query.pop("ssl"))
    return url.set(drivername="postgresql", query=query).render_as_string(hide_password=False)


def add_blueprint(app: App, blueprint: Blueprint) -> None:
    """Declare ``blueprint``'s tasks on ``app``, under their own names, and its periodic tasks.

    procrastinate's ``App.add_tasks_from`` would rebind the blueprint's task objects to ``app`` (and
    rename them), so a module's blueprint could serve one app per Python process; tests and the
    embedded server build several. Each app gets task objects of its own instead, and the module's
    blueprint stays unbound: defer through an app (:func:`defer`), never through the task.
    """
    copies: dict[str, Task[Any, Any, Any]] = {}
    for name, task in blueprint.tasks.items():
        if task.name != name:
            continue  # an alias: registered with its task
        options: dict[str, Any] = {
            "name": task.name,
            "aliases": list(task.aliases),
            "queue": task.queue,
            "priority": task.priority,
            "lock": task.lock,
            "queueing_lock": task.queueing_lock,
            "retry": RequeueOnShutdown(then=task.retry_strategy),
            "task_middleware": list(task.task_middleware),
        }
        declare = app.task(pass_context=True, **options) if task.pass_context else app.task(**options)
        copies[name] = declare(task.func)
    for periodic in blueprint.periodic_registry.periodic_tasks.values():
        app.periodic_registry.register_task(
            task=copies[periodic.task.name],
            cron=periodic.cron,
            periodic_id=periodic.periodic_id,
            configure_kwargs=periodic.configure_kwargs,
        )


async def defer(
    job_app: App,
    task_name: str,
    *,
    queue: Queue,
    tenant: str | None = None,
    lock: str | None = None,
    queueing_lock: str | None = None,
    **kwargs: Any,
) -> int:
    """Queue a job of task ``task_name`` with ``kwargs`` (JSON values) as its arguments; its id.

    ``tenant``: whose share of the workers the job takes (see the module docs); it is also passed
    to the task as its ``tenant`` argument. ``lock``: jobs with the same lock run one at a time,
    in order of priority, then of age (with ``tenant``, a lock's jobs need not run in the order
    they were queued); ``queueing_lock``: at most one such job waits in the queue
    (a second defer raises ``procrastinate.exceptions.AlreadyEnqueued``).
    """
    if tenant is not None:
        kwargs["tenant"] = tenant
    async with _ranked(job_app, queue=queue, tenant=tenant) as (priority, connection):
        deferrer = job_app.configure_task(
            task_name,
            queue=queue,
            lock=lock,
            queueing_lock=queueing_lock,
            priority=priority,
            connection=connection,
        )
        return await deferrer.defer_async(**kwargs)


@contextlib.asynccontextmanager
async def _ranked(job_app: App, *, queue: Queue, tenant: str | None) -> AsyncIterator[tuple[int, Any]]:
    """The priority of a job of ``tenant`` on ``queue`` (0 for none), and the connection to insert
    it on (PostgreSQL; else None), held until it is inserted: a tenant's jobs are placed and
    inserted one at a time, in this process and across processes. Placed concurrently, a burst of
    defers would all see the same line and take the same place, ahead of other tenants' jobs."""
    if tenant is None:
        yield 0, None
        return
    key = (queue, tenant)
    share = _share_locks.get(key)
    if share is None:
        share = _share_locks[key] = asyncio.Lock()
    async with share:
        connector = job_app.connector
        if not isinstance(connector, procrastinate.PsycopgConnector):
            yield await fair_priority(job_app, queue=queue, tenant=tenant), None
            return
        async with connector.pool.connection() as connection, connection.transaction():
            await connector.execute_query_all_async_with_connection(
                connection, _SHARE_LOCK, queue=queue, tenant=tenant
            )
            yield await fair_priority(job_app, queue=queue, tenant=tenant, connection=connection), connection


async def fair_priority(job_app: App, *, queue: Queue, tenant: str, connection: Any = None) -> int:
    """The priority a new job of ``tenant`` on ``queue`` takes (see the module docs): that of the
    jobs served now when the tenant has none waiting or running, else one below its lowest; on
    PostgreSQL read on ``connection`` when given (a transaction's)."""
    connector = job_app.connector
    if isinstance(connector, InMemoryConnector):  # the embedded store: jobs live in this process
        pending = [
            job
            for job in connector.jobs.values()
            if job["queue_name"] == queue
            and job["status"] in ("todo", "doing")
            and job["priority"] > RETRY_PRIORITY
        ]
        serving = min((job["priority"] for job in pending if job["status"] == "doing"), default=None)
        head = max((job["priority"] for job in pending if job["status"] == "todo"), default=None)
        own = min((job["priority"] for job in pending if job["args"].get("tenant") == tenant), default=None)
    else:
        arguments: dict[str, Any] = {"queue": queue, "tenant": tenant, "retry": RETRY_PRIORITY}
        if connection is not None and isinstance(connector, procrastinate.PsycopgConnector):
            row = await connector.execute_query_one_async_with_connection(connection, _LINE, **arguments)
        else:
            row = await connector.execute_query_one_async(_LINE, **arguments)
        serving, head, own = row["serving"], row["head"], row["own"]
    now = serving if serving is not None else head if head is not None else 0
    place = now if own is None else min(now, own - 1)
    return max(place, RETRY_PRIORITY + 1)


def job_resources(context: JobContext) -> Resources:
    """The ``Resources`` of the process running this job (the worker's ``additional_context``)."""
    return cast("Resources", context.additional_context[RESOURCES_KEY])


class RequeueOnShutdown(BaseRetryStrategy):
    """Put a job back on its queue when the worker stops before the job ends, and leave every other
    failure to the task's own strategy (``then``; none: the job fails).

    A worker shutting down gives its jobs ``SABRE_WORKER_SHUTDOWN_SECONDS`` and then cancels them;
    cancelled this way, a job is due to run again at once on another worker, whatever the task
    declared. The engine wraps every task in it (:func:`add_blueprint`).
    """

    def __init__(self, *, then: BaseRetryStrategy | None) -> None:
        self.then = then

    def get_retry_decision(self, *, exception: BaseException, job: Job) -> RetryDecision | None:
        """Retry now after a shutdown's cancellation, else as ``then`` decides."""
        if isinstance(exception, asyncio.CancelledError):
            return RetryDecision(retry_in={"seconds": 0})
        if self.then is None:
            return None
        exc = self.then.get_retry_exception(exception=exception, job=job)
        return None if exc is None else exc.retry_decision


def _add_stalled_jobs_task(app: App, *, settings: Settings) -> None:
    """Every ``SABRE_JOBS_STALLED_CHECK_SECONDS``, one worker puts back on their queue the jobs of
    workers silent for ``SABRE_JOBS_STALLED_SECONDS`` (a worker killed mid-job never ends its job;
    this is how another worker gets it). Periodic jobs are deferred once per tick, whichever
    workers are up; retrying a job that is no longer running does nothing, so a tick that overlaps
    another is harmless."""
    threshold = settings.jobs_stalled_seconds

    async def retry_stalled_jobs(context: JobContext, timestamp: int) -> None:
        manager = context.app.job_manager
        for job in await manager.get_stalled_jobs(seconds_since_heartbeat=threshold):
            try:
                await manager.retry_job(job)
            except ConnectorException as exc:
                log.warning("stalled_job_not_retried", job_id=job.id, task=job.task_name, error=str(exc))
                continue
            log.warning(
                "stalled_job_retried",
                job_id=job.id,
                task=job.task_name,
                attempts=job.attempts + 1,
                reason=f"its worker sent no heartbeat for {threshold:g} s",
            )

    task = app.task(name=STALLED_TASK, queue="maintenance", pass_context=True)(retry_stalled_jobs)
    every = settings.jobs_stalled_check_seconds
    # croniter's sixth field is the second.
    app.periodic(cron=f"* * * * * */{every}", periodic_id="stalled")(task)


def _add_cleanup_task(app: App) -> None:
    """Every hour, delete the jobs that ended unsuccessfully more than ``KEEP_FAILED_HOURS`` ago
    (failed, cancelled, aborted; successful ones are deleted as they end)."""

    async def remove_old_jobs(context: JobContext, timestamp: int) -> None:
        await context.app.job_manager.delete_old_jobs(
            nb_hours=KEEP_FAILED_HOURS, include_failed=True, include_cancelled=True, include_aborted=True
        )

    task = app.task(name=CLEANUP_TASK, queue="maintenance", pass_context=True)(remove_old_jobs)
    app.periodic(cron="17 * * * *", periodic_id="cleanup")(task)


def worker_options(
    settings: Settings, *, resources: Resources, queues: tuple[Queue, ...], concurrency: int, name: str
) -> WorkerOptions:
    """How a worker lane of this service runs: its queues, LISTEN/NOTIFY for fast pickup, a heartbeat
    well inside the stall threshold, successful jobs deleted (failed ones kept to inspect)."""
    return {
        "queues": list(queues),
        "name": name,
        "concurrency": concurrency,
        "listen_notify": True,
        # A NOTIFY wakes a worker for a new job; retries and scheduled jobs are found by polling
        # (a query on PostgreSQL; a look at a dict for the in-memory store, so often there).
        "fetch_job_polling_interval": EMBEDDED_POLL_SECONDS if settings.is_sqlite else STORE_POLL_SECONDS,
        "shutdown_graceful_timeout": settings.worker_shutdown_seconds,
        "delete_jobs": "successful",
        "additional_context": {RESOURCES_KEY: resources},
        # Signals are the process's: `sabre worker` and uvicorn install their own.
        "install_signal_handlers": False,
        # A third of the stall threshold (at most procrastinate's 10 s): one late beat is no death.
        "update_heartbeat_interval": min(10.0, settings.jobs_stalled_seconds / 3),
        "stalled_worker_timeout": settings.jobs_stalled_seconds,
    }


async def run_worker(job_app: App, *, resources: Resources, concurrency: int, name: str) -> None:
    """Run a worker until it is cancelled, then stop it gracefully: no new job, running jobs get
    ``SABRE_WORKER_SHUTDOWN_SECONDS`` to end, the rest go back on their queue. Returns on its own
    only when the worker stopped without being asked (its database connection failed).

    A worker is two engine workers on one app, one per lane of ``LANES``: turns and upkeep with
    ``concurrency`` slots, webhooks with ``SABRE_WEBHOOK_CONCURRENCY``. One that stops stops the
    other, so the process's supervisor sees one worker."""
    settings = resources.settings
    sizes = (concurrency, settings.webhook_concurrency)
    # Workers made here, not by ``App.run_worker_async``, to keep a handle on each to stop it.
    workers = [
        Worker(
            app=job_app,
            **worker_options(
                settings, resources=resources, queues=queues, concurrency=size, name=f"{name}-{queues[0]}"
            ),
        )
        for queues, size in zip(LANES, sizes, strict=True)
    ]
    lanes = [
        asyncio.create_task(
            worker.run(),  # type: ignore[no-untyped-call]  # procrastinate leaves it unannotated
            name=f"sabre job worker ({', '.join(queues)})",
        )
        for worker, queues in zip(workers, LANES, strict=True)
    ]
    try:
        done, _ = await asyncio.wait(lanes, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Asked to stop, then cancelled: a cancellation alone is lost when it lands in a driver's
        # call during the lane's start (psycopg's pool swallows it), and that lane then ran on
        # until the process's stop gave up on it (SABRE_WORKER_SHUTDOWN_SECONDS + 10 s, at every
        # app's close); a lane not started yet never starts. Each stops gracefully (its jobs get
        # their grace period).
        for worker in workers:
            worker.stop()  # type: ignore[no-untyped-call]  # procrastinate leaves it unannotated
        for lane in lanes:
            lane.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
    for lane in done:
        lane.result()  # a lane's failure is the worker's


@contextlib.asynccontextmanager
async def worker_in_process(job_app: App, *, resources: Resources) -> AsyncIterator[None]:
    """Run a worker beside the API in this process while the context is open; a worker that stops
    on its own (its store went away) is started again after a pause, until the context closes."""
    closing = False

    async def supervise() -> None:
        pause = 1.0
        # The flag, not the cancellation alone: a cancellation lost in a driver's call (see
        # app.kit.periodic) would otherwise end one worker and start the next on a closed app.
        while True:
            try:
                await run_worker(
                    job_app,
                    resources=resources,
                    concurrency=resources.settings.worker_concurrency,
                    name="serve",
                )
            except Exception:
                if closing:
                    return
                log.exception("job_worker_failed", retry_in_seconds=pause)
            else:
                if closing:
                    return
                log.error("job_worker_stopped", retry_in_seconds=pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 30.0)

    task = asyncio.create_task(supervise(), name="sabre job worker")
    try:
        yield
    finally:
        closing = True
        # Bounded: procrastinate waits for its jobs, then for each to take its cancellation, without
        # a bound; one that never does must not hold the process's shutdown for ever. A job left
        # behind runs again elsewhere once this process's heartbeat is stale (at least once).
        within = resources.settings.worker_shutdown_seconds + STOP_MARGIN_SECONDS
        if not await stop_task(task, within=within):
            log.error("job_worker_stop_timed_out", waited_seconds=within)
