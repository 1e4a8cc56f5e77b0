"""Turns that outlive their request: run from the store by this process or a job worker, and
recovered when the process that ran them died.

A stored turn carries what it runs (its request) and a lease; ``ConversationService.execute_stored``
claims it with a compare-and-set, so running it twice, as an at-least-once job engine may, is
harmless: the second claim fails, or the second outcome is refused by the conversation's version.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import procrastinate
import structlog
from procrastinate import JobContext
from procrastinate.exceptions import AlreadyEnqueued
from sqlalchemy.ext.asyncio import AsyncSession

from app.conversations.service import ConversationService
from app.kit import periodic, tracing
from app.kit.jobs import defer, job_resources

if TYPE_CHECKING:
    from app.wiring import Resources

log = structlog.get_logger(__name__)

RECOVERY_SECONDS = 10.0
TASK = "run_turn"

blueprint = procrastinate.Blueprint()


@blueprint.task(name=TASK, queue="turns", pass_context=True)
async def run_turn(
    context: JobContext,
    turn_id: str,
    request_id: str | None = None,
    trace_context: dict[str, str] | None = None,
    tenant: str | None = None,
) -> None:
    """The job of a background turn (at least once: a rerun finds it claimed or ended). It logs
    under the id of the request that started it, and continues that request's trace. ``tenant``
    only places the job in its tenant's share (``app.kit.jobs.defer``); the turn's row says whose
    it is."""
    with (
        structlog.contextvars.bound_contextvars(**({"request_id": request_id} if request_id else {})),
        tracing.continued(trace_context),
    ):
        await run_stored_turn(job_resources(context), turn_id)


async def defer_turn(resources: Resources, turn_id: str, *, tenant: str) -> None:
    """Hand a stored turn to the job workers, in its tenant's share of them, with the request id
    and trace context of the request that stored it (when there is one) for the job's logs and
    spans. A turn whose job still waits is not queued again (the recovery sweep hands out turns
    queued long, and with fair shares a waiting job may be one that waits its turn): it keeps its
    place."""
    request_id = structlog.contextvars.get_contextvars().get("request_id")
    extra: dict[str, Any] = {}
    if isinstance(request_id, str):
        extra["request_id"] = request_id
    carried = tracing.carrier()
    if carried:
        extra["trace_context"] = carried
    try:
        await defer(
            resources.jobs,
            TASK,
            queue="turns",
            tenant=tenant,
            queueing_lock=f"turn:{turn_id}",
            turn_id=turn_id,
            **extra,
        )
    except AlreadyEnqueued:
        log.info("turn_still_queued", turn_id=turn_id)


def service_for(resources: Resources, session: AsyncSession) -> ConversationService:
    """The conversations service over ``session`` and the process's shared resources."""
    return ConversationService(
        session=session,
        settings=resources.settings,
        personas=resources.personas,
        loop=resources.turn_loop,
        locks=resources.locks,
        mcp=resources.mcp,
        control=resources.control,
        sessionmaker=resources.sessionmaker,
        resources=resources,
    )


async def run_stored_turn(resources: Resources, turn_id: str) -> None:
    """Run one stored turn to its end (a no-op when it already ended or runs elsewhere). What it
    logs carries its ids, unbound again when it ends (a worker's next job is another turn)."""
    with structlog.contextvars.bound_contextvars(turn_id=turn_id, conversation_id=None):
        await _run_stored_turn(resources, turn_id)


async def _run_stored_turn(resources: Resources, turn_id: str) -> None:
    async with resources.sessionmaker() as session:
        try:
            await service_for(resources, session).execute_stored(turn_id)
        except Exception:
            log.exception("stored_turn_crashed", turn_id=turn_id)
            raise


async def recover_turns(resources: Resources) -> int:
    """One pass over turns whose runner died or that waited too long in the queue: stored ones are
    dispatched again (a job, or a task here), waited-for ones end ``failed``. How many were found."""
    async with resources.sessionmaker() as session:
        service = service_for(resources, session)
        rerun = await service.recover(queued_after=timedelta(seconds=resources.settings.turn_requeue_seconds))
    for turn_id, tenant in rerun.items():
        log.info("turn_recovered", turn_id=turn_id)
        await resources.control.dispatch(turn_id, tenant=tenant, background=True)
    return len(rerun)


@contextlib.asynccontextmanager
async def recovering(resources: Resources, *, every: float = RECOVERY_SECONDS) -> AsyncIterator[None]:
    """Sweep for abandoned turns at start and every ``every`` seconds while the body runs (a pass
    that fails is logged and the next one runs; the body's exit waits for a pass at most
    ``periodic.STOP_WAIT``: one that lost its cancellation in a Redis call cannot hold it)."""

    async def sweep() -> None:
        await recover_turns(resources)

    async with periodic.every(every, sweep, name="sabre-turn-recovery", immediately=True):
        yield
