"""Attacks on the per-worker cgroups (test_cgroups.py) that once broke them, each under both
backends: what a block leaves in its IPC namespace outlived it, still charged to its worker's
cgroup (process: for good, past the cgroup); under bwrap its processes kept the worker's OOM score
instead of raising theirs; and a retired worker's memory cgroup stayed in the kernel (dying) while
its blocks' page cache was charged to it."""

from __future__ import annotations

import asyncio
import ctypes
import json
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from app.runtime import Limits, RuntimePool
from app.runtime.isolation import cgroups as cgroups_module
from app.runtime.isolation import open_cgroups
from tests.runtime.support import BACKENDS, run, started_pool
from tests.runtime.test_cgroups import needs_cgroups

in_package_loop = pytest.mark.asyncio(loop_scope="package")

_IPC_RMID = 0


@pytest_asyncio.fixture(loop_scope="package", params=BACKENDS)
async def one_worker(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """A pool of one worker (no preloads): consecutive blocks run in the same worker's cgroup."""
    async with started_pool(request.param, workspaces, size=1) as started:
        yield started


# A SysV segment of 340 MB, touched, then detached: no process holds it when the block ends.
_SEGMENT = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = 340 << 20
made = {"id": None, "error": None}
sid = libc.shmget(0, ctypes.c_size_t(size), 0o1600)
if sid < 0:
    made["error"] = os.strerror(ctypes.get_errno())
else:
    made["id"] = sid
    addr = libc.shmat(sid, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        made["error"] = os.strerror(ctypes.get_errno())
    else:
        ctypes.memset(addr, 1, size)
        libc.shmdt(ctypes.c_void_p(addr))
print(json.dumps(made))
"""
_HOG = """
held = bytearray(200 << 20)
held[::4096] = b"\\x01" * len(range(0, 200 << 20, 4096))
result(sum(held))
del held
"""


@needs_cgroups
@in_package_loop
async def test_shared_memory_a_block_leaves_is_not_charged_to_the_next_block(
    one_worker: RuntimePool, tmp_path: Path, workspaces: Path
) -> None:
    # Each fits in the address space a process may have (memory_mb less /tmp's and /dev/shm's
    # 100 MB under bwrap, and what a worker's later child inherits of its address space), the two
    # together not in the block's memory.
    limits = Limits(memory_mb=512)
    left = await run(one_worker, _SEGMENT, workdir=tmp_path, limits=limits)
    made = json.loads(left.stdout)
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        # Another conversation's block in the same worker: its 200 MB fit in its 512 MB.
        other = Path(tempfile.mkdtemp(prefix="next-", dir=workspaces))
        outcome = await run(one_worker, _HOG, workdir=other, limits=limits)
        assert (outcome.status, outcome.results) == ("ok", [str(200 << 20 >> 12)]), (made, outcome)
    finally:
        if one_worker.sandbox == "process" and made["id"] is not None:
            libc.shmctl(made["id"], _IPC_RMID, None)  # what the block left in the host's namespace
    # A block makes no SysV segment at all: under the process backend it would stay in the
    # host's IPC namespace; under bwrap it goes with the block's own, but some time after.
    assert made == {"id": None, "error": "Function not implemented"}, made


_SCORES = """
import subprocess, sys
spawned = subprocess.run([sys.executable, "-S", "-c", "print(open('/proc/self/oom_score_adj').read())"],
                         capture_output=True, text=True).stdout
result([open("/proc/self/oom_score_adj").read().strip(), spawned.strip()])
"""


@needs_cgroups
@in_package_loop
async def test_a_blocks_processes_are_the_oom_killers_first_choice(
    one_worker: RuntimePool, tmp_path: Path
) -> None:
    outcome = await run(one_worker, _SCORES, workdir=tmp_path)
    assert (outcome.status, outcome.results) == ("ok", [json.dumps(["1000", "1000"])]), outcome


_WRITER = """
import os, sys
sys.stdin.readline()  # placed in the cgroup meanwhile
with open(sys.argv[1], "wb") as f:
    f.write(b"x" * (8 << 20))
"""


@needs_cgroups
def test_a_worker_cgroup_is_removed_with_nothing_charged_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A removed memory cgroup that still has pages charged (the page cache of what its blocks
    # wrote) stays in the kernel, dying, until they are reclaimed: a block that has its worker
    # retired again and again piled them up towards the kernel's 65,535 (no memory cgroup can
    # then be made on the host). Its charges go before it is removed.
    cgroups = open_cgroups()
    try:
        cgroup = cgroups.create()
        writer = subprocess.Popen(
            [sys.executable, "-S", "-c", _WRITER, str(tmp_path / "written")], stdin=subprocess.PIPE
        )
        assert writer.stdin is not None
        cgroup.place(writer.pid)
        writer.stdin.write(b"go\n")
        writer.stdin.close()
        assert writer.wait(30) == 0
        usage = cgroup.memory / ("memory.usage_in_bytes" if cgroup.version == 1 else "memory.current")
        assert int(usage.read_text()) >= 8 << 20  # the file's page cache, charged to it
        charged_at_removal: list[int] = []
        rmdir = cgroups_module._rmdir

        def recording_rmdir(path: Path) -> bool:
            if path == cgroup.memory and path.exists():
                charged_at_removal.append(int(usage.read_text()))
            return rmdir(path)

        monkeypatch.setattr(cgroups_module, "_rmdir", recording_rmdir)
        asyncio.run(cgroups.remove(cgroup))
        assert not cgroup.memory.exists()
        assert charged_at_removal
        assert charged_at_removal[-1] < 1 << 20, charged_at_removal
    finally:
        asyncio.run(cgroups.close())
