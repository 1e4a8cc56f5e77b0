"""A cgroup per worker: the kernel bounds a block's whole process tree (memory, tasks), the worker
its CPU time, and an OOM inside the tree ends that block alone as out of memory.

Each test runs under both backends, in pools of its own (no preloads: they start fast) where it
needs a fresh one, and only where the host lets the server make cgroups (as root on CI); the
test of a host without them points the pool at a directory that is no cgroup file system.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import structlog

from app.runtime import BlockOutcome, Limits, RuntimePool
from app.runtime.isolation import Cgroups, CgroupsUnavailable, WorkerCgroup, open_cgroups
from tests.runtime.support import BACKENDS, assert_pool_works, bwrap_unavailable, run, started_pool

in_package_loop = pytest.mark.asyncio(loop_scope="package")

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
_MEMORY_MB = 512


def _cgroups_problem() -> str | None:
    """Why this host gives the server no cgroups (None when it does): the tests that need them skip."""
    try:
        cgroups = open_cgroups()
    except CgroupsUnavailable as exc:
        return str(exc)
    asyncio.run(cgroups.close())
    return None


_PROBLEM = _cgroups_problem()
needs_cgroups = pytest.mark.skipif(_PROBLEM is not None, reason=f"no cgroups here: {_PROBLEM}")


@pytest_asyncio.fixture(loop_scope="package", params=BACKENDS)
async def fresh_pool(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """A two-worker pool of its own (no preloads), with a cgroup per worker."""
    async with started_pool(request.param, workspaces, size=2) as started:
        yield started


def _cgroups(pool: RuntimePool) -> Cgroups:
    cgroups = pool.cgroups
    assert cgroups is not None, pool.block_limits
    return cgroups


async def _peak_while(pool: RuntimePool, task: asyncio.Future[BlockOutcome]) -> int:
    """The highest memory peak of the pool's worker cgroups, read until ``task`` is done (a
    worker's cgroup goes once it is retired)."""
    peak = 0
    while True:
        for cgroup in list(_cgroups(pool).workers):
            peak = max(peak, cgroup.peak_bytes() or 0)
        if task.done():
            return peak
        await asyncio.sleep(0.01)


# Four programs, each allocating and touching 80% of the block's memory, then holding it a while.
_HOGS = f"""
import subprocess, sys
hog = (
    "b = bytearray({int(_MEMORY_MB * 0.8) << 20})\\n"
    "for i in range(0, len(b), 4096):\\n    b[i] = 1\\n"
    "import time; time.sleep(3)\\n"
)
procs = [subprocess.Popen([sys.executable, "-S", "-c", hog]) for _ in range(4)]
result([p.wait() for p in procs])
"""
# Beside it, another conversation's block that holds some memory for a while.
_BESIDE = """
import time
held = bytearray(64 << 20)
held[::4096] = b"\\x01" * len(range(0, 64 << 20, 4096))
time.sleep(1.5)
result(sum(held))
del held
"""


@needs_cgroups
@in_package_loop
async def test_a_block_whose_processes_hog_memory_together_ends_at_its_memory_limit(
    fresh_pool: RuntimePool, tmp_path: Path, workspaces: Path
) -> None:
    # Each process alone stays under its address-space limit (file_size_mb keeps /tmp small):
    # only the tree as a whole is past memory_mb.
    limits = Limits(memory_mb=_MEMORY_MB, file_size_mb=8, wall_clock_seconds=30)
    beside_dir = Path(tempfile.mkdtemp(prefix="beside-", dir=workspaces))
    hogs = asyncio.ensure_future(run(fresh_pool, _HOGS, workdir=tmp_path, limits=limits))
    beside = asyncio.ensure_future(run(fresh_pool, _BESIDE, workdir=beside_dir))
    peak = await _peak_while(fresh_pool, hogs)
    outcome, other = await hogs, await beside
    assert (outcome.status, outcome.limit) == ("limit", f"memory {_MEMORY_MB}MB"), outcome
    # It got as far as the limit, and no further (the kernel's count of the cgroup's peak).
    assert 0.75 * (_MEMORY_MB << 20) <= peak <= 1.02 * (_MEMORY_MB << 20), peak >> 20
    assert (other.status, other.results) == ("ok", [str(64 << 20 >> 12)]), other
    await assert_pool_works(fresh_pool, tmp_path)


_SPINNERS = """
import subprocess, sys
spin = "import time\\nwhile time.process_time() < 0.9:\\n    pass\\n"
procs = [subprocess.Popen([sys.executable, "-S", "-c", spin]) for _ in range(4)]
result([p.wait() for p in procs])
"""


@needs_cgroups
@in_package_loop
async def test_a_block_whose_processes_spin_together_ends_at_its_cpu_limit(
    fresh_pool: RuntimePool, tmp_path: Path
) -> None:
    # Each process stays under its own RLIMIT_CPU; the four together use 3.6 s of a 1 s budget.
    limits = Limits(cpu_seconds=1, wall_clock_seconds=30)
    outcome = await run(fresh_pool, _SPINNERS, workdir=tmp_path, limits=limits)
    assert (outcome.status, outcome.limit) == ("limit", "cpu_time 1s"), outcome
    await assert_pool_works(fresh_pool, tmp_path)


def _control_files(cgroup: WorkerCgroup) -> list[str]:
    """What a block would write to enlarge its cgroup or leave it: its limits, and the process
    lists of its pool's directory and of the hierarchy's root."""
    targets: list[str] = []
    for directory in cgroup.dirs:
        targets += [str(p) for p in directory.iterdir() if p.name.endswith(("limit_in_bytes", ".max"))]
        targets += [str(directory.parent / "cgroup.procs"), str(directory.parents[1] / "cgroup.procs")]
    return targets


_ESCAPE = """
import json
tried = {{}}
for path in {targets!r}:
    try:
        with open(path, "w") as handle:
            handle.write("0" if path.endswith("cgroup.procs") else "9223372036854771712")
        tried[path] = "written"
    except OSError as exc:
        tried[path] = type(exc).__name__
print(json.dumps({{"tried": tried, "cgroup": open("/proc/self/cgroup").read()}}))
"""


@needs_cgroups
@in_package_loop
async def test_a_block_cannot_enlarge_or_leave_its_cgroup(pool: RuntimePool, tmp_path: Path) -> None:
    cgroups = _cgroups(pool)
    targets = [path for cgroup in cgroups.workers for path in _control_files(cgroup)]
    limits = Limits(memory_mb=768)
    outcome = await run(pool, _ESCAPE.format(targets=targets), workdir=tmp_path, limits=limits)
    assert outcome.status == "ok", outcome.error
    report = json.loads(outcome.stdout)
    assert report["tried"]
    assert "written" not in report["tried"].values(), report["tried"]
    # It ran in its worker's cgroup (seen relative to its cgroup namespace under bwrap), whose
    # limit is still the block's own.
    memory_line = next(line for line in report["cgroup"].splitlines() if ":memory:" in line)
    (mine,) = [c for c in cgroups.workers if memory_line.endswith(f"/{c.memory.parent.name}/{c.name}")]
    assert mine.memory_limit() == 768 << 20
    assert mine.limits == (768 << 20, limits.max_processes + 2)


@pytest.mark.parametrize("backend", BACKENDS)
@needs_cgroups
@in_package_loop
async def test_the_cgroups_are_gone_once_the_pool_closes(
    backend: str, workspaces: Path, tmp_path: Path
) -> None:
    if backend == "bwrap" and (why := await bwrap_unavailable(workspaces)) is not None:
        pytest.skip(f"bubblewrap cannot run here: {why}")
    pool = RuntimePool(size=1, preload=(), sandbox=backend, workspaces=workspaces)  # type: ignore[arg-type]
    await pool.start()
    try:
        # The retired worker's cgroup goes too (its replacement gets one of its own).
        outcome = await run(pool, "import os\nos.kill(os.getpid(), 9)", workdir=tmp_path)
        assert outcome.status == "error"
        await assert_pool_works(pool, tmp_path)
        cgroups = _cgroups(pool)

        def left() -> list[str]:
            return sorted(p.name for p in cgroups.memory.iterdir() if p.is_dir())

        # The retired worker's cgroup goes in the background, one hierarchy after another, and
        # stays the pool's until it is gone from all: wait for that before listing what is left
        # (listed before, it could name a directory just removed).
        for _ in range(100):
            if left() == ["w1"] and len(cgroups.workers) == 1:
                break
            await asyncio.sleep(0.05)
        assert left() == ["w1"]
        assert len(cgroups.workers) == 1
        made = [cgroups.memory, cgroups.pids, *([cgroups.cpu] if cgroups.cpu else [])]
        made += [d for cgroup in cgroups.workers for d in cgroup.dirs]
        assert all(path.is_dir() for path in made)
    finally:
        await pool.aclose()
    assert [path for path in made if path.exists()] == []


@needs_cgroups
def test_a_dead_servers_cgroups_are_removed_with_what_runs_in_them() -> None:
    cgroups = open_cgroups()
    try:
        # A pool directory named as a server that is gone would name it, holding a process.
        gone = subprocess.Popen(["true"])
        gone.wait()
        own = cgroups.memory.name.split("-")
        stale = cgroups.memory.parent / f"sabre-{own[1]}-{gone.pid}-1-0"
        (stale / "w0").mkdir(parents=True)
        sleeper = subprocess.Popen(["sleep", "60"])
        (stale / "w0" / "cgroup.procs").write_text(str(sleeper.pid))
        again = open_cgroups()
        asyncio.run(again.close())
        assert not stale.exists()
        assert sleeper.wait(5) == -9
        assert cgroups.memory.is_dir()  # a live server's are left alone
    finally:
        asyncio.run(cgroups.close())


@needs_cgroups
@in_package_loop
async def test_a_removal_cancelled_midway_is_finished_when_the_pool_closes() -> None:
    """A retired worker's cgroup is removed in the background, a few attempts apart while its
    processes exit; the pool closing cancels that. The cgroup must stay the pool's to remove:
    forgotten, it kept the pool's own directories from going, and the close waited on them for
    15 s (a CI failure of test_closing_while_a_replacement_starts_never_hangs). What holds the
    cgroup here is a sub-directory (it holds it on v1 and v2 alike, and no kill removes it)."""
    cgroups = open_cgroups()
    try:
        cgroup = cgroups.create()
        member = await asyncio.create_subprocess_exec("sleep", "60")
        cgroup.place(member.pid)
        holder = cgroup.memory / "held"
        holder.mkdir()
        removing = asyncio.ensure_future(cgroups.remove(cgroup))
        await asyncio.sleep(0.3)  # the member is killed; the directory stays, attempt after attempt
        assert not removing.done()
        removing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await removing
        assert await asyncio.wait_for(member.wait(), 5) == -9
        holder.rmdir()  # what held it is gone: the close can remove it
        began = time.monotonic()
        await cgroups.close()
        assert time.monotonic() - began < 2
        assert [d for d in (*cgroup.dirs, cgroups.memory, cgroups.pids) if d.exists()] == []
    finally:
        await cgroups.close()


@pytest.mark.parametrize("backend", BACKENDS)
@in_package_loop
async def test_without_cgroups_blocks_are_limited_per_process_and_the_pool_says_so(
    backend: str, workspaces: Path, tmp_path: Path
) -> None:
    if backend == "bwrap" and (why := await bwrap_unavailable(workspaces)) is not None:
        pytest.skip(f"bubblewrap cannot run here: {why}")
    not_cgroups = Path(tempfile.mkdtemp(prefix="no-cgroups-"))
    try:
        with structlog.testing.capture_logs() as logs:
            pool = RuntimePool(
                size=1,
                preload=(),
                sandbox=backend,  # type: ignore[arg-type]
                workspaces=workspaces,
                cgroup_root=not_cgroups,
            )
            await pool.start()
        try:
            assert pool.cgroups is None
            assert pool.block_limits.startswith("per process only")
            warnings = [e for e in logs if e["event"] == "sandbox_memory_per_process"]
            assert len(warnings) == 1
            assert warnings[0]["log_level"] == "warning"
            assert str(not_cgroups) in warnings[0]["reason"]
            bomb = "hog = []\nwhile True:\n    hog.append(bytearray(50 << 20))\n"
            outcome = await run(pool, bomb, workdir=tmp_path, limits=Limits(memory_mb=512))
            assert (outcome.status, outcome.limit) == ("limit", "memory 512MB")
            await assert_pool_works(pool, tmp_path)
        finally:
            await pool.aclose()
        assert os.listdir(not_cgroups) == []
    finally:
        os.rmdir(not_cgroups)


def test_the_probe_says_which_limits_are_in_force(tmp_path: Path) -> None:
    def probe(*extra: str) -> str:
        command = [sys.executable, "-m", "app.runtime.isolation.probe", "--limits", *extra]
        done = subprocess.run(command, cwd=_PROJECT_ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert probe("--cgroup-root", str(tmp_path)).startswith("block limits: per process only")
    if _PROBLEM is None:
        assert probe().startswith("block limits: per block (cgroup v")
