"""Attacker pass on live processes: what a block of a live process sets up to run *after* its
``done`` (a signal handler of the SIGCHLD the worker's end-of-block sweep causes, or of a timer it
armed itself) must not run between the blocks, nor outlive the block it runs in, nor reach the
next conversation that runs on the same worker."""

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
from tests.runtime.support import BACKENDS, conversation, host_processes_with, run, started_pool

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=BACKENDS)
async def short(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """Two workers, no preloads; a live process is released 0.8 s after its block."""
    async with started_pool(request.param, workspaces, size=2, live_seconds=0.8) as pool:
        yield pool


# The block leaves a process running and handles SIGCHLD: the worker's end-of-block sweep kills
# that process, and the handler would then run while the process is live (blocked on its next
# request), after the sweep, and start a daemon in a session of its own that appends to a file of
# the conversation every 50 ms. (The block's own ITIMER_REAL is cleared at its report.)
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


async def test_nothing_of_a_block_runs_between_the_blocks_of_a_live_process(
    short: RuntimePool, workspaces: Path
) -> None:
    """A live process holds every signal from its ``done`` to its next block: the handler runs at
    the start of that block, within its limits, and what it starts dies with it; or never."""
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
        assert not beat.exists(), "the block's handler ran between its blocks"
        # The next block of A: the held SIGCHLD reaches the handler now, inside this block.
        second = await run(
            short, "import time\ntime.sleep(0.3)\nresult('second')", workdir=attacker, snapshot=first.snapshot
        )
        assert (second.status, second.results, second.process) == ("ok", ["second"], "live"), second.error
        assert beat.exists()
        size = beat.stat().st_size
        await asyncio.sleep(0.3)
        assert beat.stat().st_size == size, "the daemon outlived the block that started it"
        assert host_processes_with(marker) == []
        await asyncio.sleep(1.0)  # past live_seconds: released, its worker rearmed
        assert short.live_processes == 0
        # Another conversation on the workers sees none of it.
        for _ in range(2):
            outcome = await run(
                short, "import os\nresult(sorted(os.listdir('/proc')))\nresult(os.getcwd())\n", workdir=victim
            )
            assert outcome.status == "ok", outcome.error
        assert beat.stat().st_size == size
        assert host_processes_with(marker) == []
    finally:
        for pid in host_processes_with(marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
