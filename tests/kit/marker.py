"""Tasks of the job engine's tests: ``test_marker`` records each of its runs in a file;
``test_stubborn`` does not end when cancelled."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import procrastinate
from procrastinate import JobContext

from app.kit.jobs import job_resources

blueprint = procrastinate.Blueprint()


@blueprint.task(name="test_marker", queue="turns", pass_context=True)
async def marker(context: JobContext, *, path: str, first_sleep: float = 0.0) -> None:
    """Append ``start PID ATTEMPTS DATA_DIR`` to ``path``; on the first attempt sleep
    ``first_sleep`` seconds (a job to kill a worker in); then append ``end PID ATTEMPTS``."""
    data_dir = job_resources(context).settings.data_dir
    attempts = context.job.attempts
    _append(path, f"start {os.getpid()} {attempts} {data_dir}")
    if attempts == 0 and first_sleep:
        await asyncio.sleep(first_sleep)
    _append(path, f"end {os.getpid()} {attempts}")


def _append(path: str, line: str) -> None:
    with Path(path).open("a") as file:
        file.write(line + "\n")


# Set by the test that runs ``test_stubborn`` once it no longer needs the job to hang on.
RELEASE = threading.Event()
STARTED = threading.Event()


@blueprint.task(name="test_stubborn", queue="turns")
async def stubborn() -> None:
    """A job that ignores cancellation until ``RELEASE`` is set: what a job stuck in a call that
    never returns looks like to the worker stopping it."""
    STARTED.set()
    while not RELEASE.is_set():
        try:
            await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            continue
