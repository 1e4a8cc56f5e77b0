"""Resource limits, the clean environment, and a pool that survives what the code does."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from app.runtime import Limits, RuntimePool, landlock
from app.runtime.worker_process import WorkerState
from tests.runtime.support import THREAD_POOLS, bwrap_unavailable, host_pid, run, wait_until_gone

pytestmark = pytest.mark.asyncio(loop_scope="package")


def _running(pid: int) -> bool:
    """Whether a process exists and is not a zombie (a container's init may not reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def assert_pool_works(pool: RuntimePool, workdir: Path) -> None:
    outcome = await run(pool, "result(6 * 7)", workdir=workdir)
    assert outcome.status == "ok"
    assert outcome.results == ["42"]


async def test_busy_loop_hits_the_wall_clock(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "print('started')\nwhile True:\n    pass\n",
        workdir=tmp_path,
        limits=Limits(wall_clock_seconds=1),
    )
    assert outcome.status == "limit"
    assert outcome.limit == "wall_clock 1s"
    assert outcome.stdout == "started\n"  # the child ended itself and kept its output
    assert outcome.snapshot is None
    assert outcome.failure is None  # it reported its own end
    await assert_pool_works(pool, tmp_path)


async def test_code_that_ignores_the_wall_clock_is_killed(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n",
        workdir=tmp_path,
        limits=Limits(wall_clock_seconds=1),
    )
    assert outcome.status == "limit"
    assert outcome.limit == "wall_clock 1s"
    assert outcome.failure == "limit"  # the runtime ended it
    await assert_pool_works(pool, tmp_path)
    await assert_pool_works(pool, tmp_path)


async def test_busy_loop_hits_the_cpu_limit(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "while True:\n    pass\n",
        workdir=tmp_path,
        limits=Limits(cpu_seconds=1, wall_clock_seconds=10),
    )
    assert outcome.status == "limit"
    assert outcome.limit == "cpu_time 1s"


async def test_sigxcpu_ignored_is_still_the_cpu_limit(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n",
        workdir=tmp_path,
        limits=Limits(cpu_seconds=1, wall_clock_seconds=10),
    )
    assert outcome.status == "limit"
    assert outcome.limit == "cpu_time 1s"
    await assert_pool_works(pool, tmp_path)


async def test_memory_bomb(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "print('allocating')\nchunks = []\nwhile True:\n    chunks.append(bytearray(10**7))\n",
        workdir=tmp_path,
        limits=Limits(memory_mb=512),
    )
    assert outcome.status == "limit"
    assert outcome.limit == "memory 512MB"
    assert outcome.stdout == "allocating\n"
    await assert_pool_works(pool, tmp_path)


async def test_writing_10_gb_is_stopped_by_the_file_size_limit(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "block = b'x' * (1 << 20)\nwith open('big.bin', 'wb') as f:\n"
        "    for _ in range(10 * 1024):\n        f.write(block)\n",
        workdir=tmp_path,
        limits=Limits(file_size_mb=5),
    )
    assert outcome.status == "limit"
    assert outcome.limit == "file_size 5MB"
    assert (tmp_path / "big.bin").stat().st_size <= 5 << 20
    await assert_pool_works(pool, tmp_path)


async def test_environment_is_clean(pool: RuntimePool, tmp_path: Path) -> None:
    assert os.environ["OPENAI_API_KEY"]  # set in the parent by the pool fixture
    outcome = await run(
        pool,
        "import os\nresult(dict(os.environ))\nresult(os.getcwd())\n",
        workdir=tmp_path,
    )
    env = json.loads(outcome.results[0])
    # process: a private TMPDIR besides (bwrap: a private /tmp).
    extra = ["TMPDIR"] if pool.sandbox == "process" else []
    assert sorted(env) == sorted(
        ["HOME", "LANG", "MPLBACKEND", "PATH", "PYTHONHASHSEED", *THREAD_POOLS, *extra]
    )
    assert env["HOME"] == str(tmp_path)
    assert env["MPLBACKEND"] == "Agg"
    assert {env[name] for name in THREAD_POOLS} == {"1"}  # numerical libraries run single-threaded
    assert outcome.results[1] == str(tmp_path)


async def test_background_processes_die_with_the_block(pool: RuntimePool, tmp_path: Path) -> None:
    # Found by an environment marker: under bwrap the block's pids are those of its namespace.
    marker = f"SABRE_TEST_MARK={uuid.uuid4().hex}"
    outcome = await run(
        pool,
        "import os, subprocess\n"
        f"env = dict(os.environ, SABRE_TEST_MARK={marker.split('=')[1]!r})\n"
        "subprocess.Popen(['sleep', '60'], env=env)\n"
        "result('started')\n",
        workdir=tmp_path,
    )
    assert outcome.status == "ok", outcome.error
    # The worker kills the block's process group right after the block's process exits.
    assert await wait_until_gone(marker, seconds=5) == []


async def test_garbage_on_the_protocol_pipe_fails_the_block(pool: RuntimePool, tmp_path: Path) -> None:
    # Write garbage to every fd of the child except the server's own stderr (the log).
    log = os.fstat(2)
    outcome = await run(
        pool,
        "import os\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        st = os.fstat(fd)\n"
        f"        if (st.st_dev, st.st_ino) != ({log.st_dev}, {log.st_ino}):\n"
        "            os.write(fd, b'\\xff' * 64)\n"
        "    except OSError:\n"
        "        pass\n"
        "import time\ntime.sleep(5)\n",
        workdir=tmp_path,
    )
    assert outcome.status == "error"
    assert outcome.error is not None
    # The worker read it from the block's own channel, refused it and killed the block.
    assert outcome.error.startswith("SandboxError: the block broke the sandbox protocol")
    assert "frame header of 4294967295 bytes" in outcome.error
    assert outcome.failure == "protocol_violation"
    await assert_pool_works(pool, tmp_path)


async def test_a_block_cannot_signal_its_worker(pool: RuntimePool, tmp_path: Path) -> None:
    """Landlock's signal scope (or, as root, another user): a block's signals stay among its own
    processes; its worker, which serves other conversations' blocks too, is out of reach."""
    if not landlock.scopes_signals() and pool.sandbox_owner is None:
        pytest.skip(f"Landlock ABI {landlock.abi()} cannot scope signals here")
    outcome = await run(pool, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", workdir=tmp_path)
    assert outcome.status == "error"
    assert outcome.error is not None
    assert "PermissionError" in outcome.error, outcome.error
    assert outcome.failure is None
    await assert_pool_works(pool, tmp_path)


async def test_pool_survives_its_worker_being_killed(pool: RuntimePool, tmp_path: Path) -> None:
    """A worker killed in the middle of a block (the OOM killer, an operator): the block fails
    as ``worker_lost`` and the pool replaces the worker."""
    running = asyncio.ensure_future(run(pool, "import time\ntime.sleep(5)\n", workdir=tmp_path))
    for _ in range(500):
        busy = [w for w in pool.workers.workers if w.state is WorkerState.RUNNING]
        if busy:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the block is in its sleep
    os.kill(host_pid(busy[0]), signal.SIGKILL)
    outcome = await running
    assert outcome.status == "error"
    assert outcome.error is not None
    assert "died" in outcome.error, outcome.error
    assert outcome.failure == "worker_lost"
    for _ in range(3):
        await assert_pool_works(pool, tmp_path)


async def test_pool_survives_its_zygote_being_killed(pool: RuntimePool, tmp_path: Path) -> None:
    """The zygote that forks the workers dies (and with it every worker and block): running
    blocks fail as ``worker_lost``, and a new zygote forks the replacements."""
    running = asyncio.ensure_future(run(pool, "import time\ntime.sleep(5)\n", workdir=tmp_path))
    for _ in range(500):
        if any(w.state is WorkerState.RUNNING for w in pool.workers.workers):
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    first = pool.workers.zygotes[0]
    os.kill(first.proc.pid, signal.SIGKILL)
    outcome = await running
    assert outcome.failure == "worker_lost", (outcome.failure, outcome.error)
    # A block that comes while the pool learns of the loss may fail as worker_lost too (as
    # with any worker that dies idle); once the pool has noticed, the replacements serve.
    for _ in range(500):
        if first not in pool.workers.zygotes and first.dead:
            break
        await asyncio.sleep(0.01)
    assert first.dead
    assert not first.workers
    for _ in range(3):
        await assert_pool_works(pool, tmp_path)
    assert all(z.proc.returncode is None for z in pool.workers.zygotes)


@pytest.mark.parametrize(
    ("code", "failure", "says"),
    [
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "killed", "killed by SIGKILL"),
        ("import os\nos._exit(3)\n", "exited_early", "exited with code 3 before it finished"),
    ],
)
async def test_a_block_that_dies_without_reporting_fails_with_a_stable_code(
    pool: RuntimePool, tmp_path: Path, code: str, failure: str, says: str
) -> None:
    outcome = await run(pool, code, workdir=tmp_path)
    assert outcome.status == "error"
    assert outcome.failure == failure
    assert outcome.error is not None
    assert says in outcome.error
    await assert_pool_works(pool, tmp_path)


async def test_two_blocks_run_at_once(tmp_path: Path) -> None:
    """Each block waits for the other's file: they can only both finish side by side."""
    code = (
        "import os, time\n"
        "open('{me}', 'w').close()\n"
        "deadline = time.monotonic() + 10\n"
        "while not os.path.exists('{other}'):\n"
        "    assert time.monotonic() < deadline, 'the other block never ran'\n"
        "    time.sleep(0.005)\n"
        "result('met')\n"
    )
    async with RuntimePool(size=2, preload=()) as own_pool:
        first, second = await asyncio.gather(
            run(own_pool, code.format(me="a", other="b"), workdir=tmp_path),
            run(own_pool, code.format(me="b", other="a"), workdir=tmp_path),
        )
    assert (first.status, second.status) == ("ok", "ok"), (first.error, second.error)
    assert first.results == second.results == ["met"]


@pytest.mark.parametrize("backend", ["bwrap", "process"])
async def test_closing_while_a_replacement_starts_never_hangs(
    backend: str, workspaces: Path, tmp_path: Path
) -> None:
    """The rare CI hang: a block breaks a limit (its worker is retired and a replacement starts),
    then the service shuts down within milliseconds. bubblewrap killed that early can die before
    its child arms the parent-death signal; the orphaned sandbox then held the worker's stdout,
    and ``aclose`` waited for the pipe forever. Each close must now end promptly."""
    if backend == "bwrap" and (why := await bwrap_unavailable(workspaces)) is not None:
        pytest.skip(f"bubblewrap cannot run here: {why}")
    for attempt in range(16):
        pool = RuntimePool(size=1, preload=(), sandbox=backend, workspaces=workspaces)  # type: ignore[arg-type]
        await pool.start()
        try:
            code = "open('big', 'wb').write(b'x' * (2 << 20))"
            outcome = await run(pool, code, workdir=tmp_path, limits=Limits(file_size_mb=1))
            assert outcome.status == "limit", outcome.error
            await asyncio.sleep(attempt * 0.002)  # 0 to 30 ms into the replacement's start
        finally:
            zygotes = list(pool.workers.zygotes)
            async with asyncio.timeout(15):
                await pool.aclose()
        assert all(z.proc.returncode is not None for z in zygotes), attempt
