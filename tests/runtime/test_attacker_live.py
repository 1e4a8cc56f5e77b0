"""Attacker pass on live processes: what a block of a live process sets up to run *after* its
``done`` (a signal handler on a timer it armed itself, which the worker's end-of-block sweep
cannot see yet) must not outlive the process's release, nor reach the next conversation that
runs on the same worker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from app.runtime import RuntimePool
from tests.runtime.support import BACKENDS, host_processes_with, run, started_pool
from tests.runtime.test_live import conversation

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=BACKENDS)
async def short(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """Two workers, no preloads; a live process is released 0.8 s after its block."""
    async with started_pool(request.param, workspaces, size=2, live_seconds=0.8) as pool:
        yield pool


# The block leaves a process running and handles SIGCHLD: the worker's end-of-block sweep kills
# that process, and the handler then runs while the process is live (blocked on its next
# request), after the sweep, and starts a daemon in a session of its own that appends to a file
# of the conversation every 50 ms. (The block's own ITIMER_REAL is cleared at its report.)
LATE_DAEMON = """\
import ctypes, os, signal, subprocess, time
def late(*_):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    time.sleep(0.2)
    if os.fork() == 0:
        os.setsid()
        ctypes.CDLL(None).prctl(15, {marker!r}, 0, 0, 0)
        while True:
            with open({path!r}, 'a') as out:
                out.write('x')
            time.sleep(0.05)
signal.signal(signal.SIGCHLD, late)
subprocess.Popen(['sleep', '60'])
result('armed')
"""


async def test_a_daemon_started_between_blocks_dies_with_the_released_process(
    short: RuntimePool, workspaces: Path
) -> None:
    marker = f"atl{os.urandom(5).hex()}"
    attacker, victim = conversation(workspaces), conversation(workspaces)
    beat = attacker / "beat.txt"
    try:
        first = await run(
            short, LATE_DAEMON.format(marker=marker.encode(), path="beat.txt"), workdir=attacker
        )
        assert (first.status, first.results) == ("ok", ["armed"]), first.error
        await asyncio.sleep(0.5)
        assert short.live_processes == 1
        assert beat.exists()  # the daemon runs while A is live
        assert beat.stat().st_size > 0
        await asyncio.sleep(0.8)  # past live_seconds: released, its worker rearmed
        assert short.live_processes == 0
        # Another conversation on the workers: sees none of it, and the beat has stopped.
        for _ in range(2):
            outcome = await run(
                short, "import os\nresult(sorted(os.listdir('/proc')))\nresult(os.getcwd())\n", workdir=victim
            )
            assert outcome.status == "ok", outcome.error
        size = beat.stat().st_size
        await asyncio.sleep(0.3)
        assert beat.stat().st_size == size, "the daemon outlived its conversation's process"
        assert host_processes_with(marker) == []
    finally:
        for pid in host_processes_with(marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
