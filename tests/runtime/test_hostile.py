"""Hostile blocks: each is contained, and the pool still runs a trivial block afterwards.

Every test runs under both backends (the ``pool`` fixture); a case the ``process`` backend does
not contain by design (the network, kill -1 as the server's own user) is skipped there, saying
why. The server's secrets are set in the test process's environment by the ``pool`` fixture and
in the initial environment of a stand-in "server" process started here.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.runtime import Limits, RuntimePool, landlock
from tests.runtime.conftest import SECRETS
from tests.runtime.support import (
    THREAD_POOLS,
    assert_pool_works,
    blocks_share_the_server_user,
    bwrap_unavailable,
    run,
    wait_until_gone,
)

pytestmark = pytest.mark.asyncio(loop_scope="package")

_PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _exists(path: str) -> bool:
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    return True


async def test_infinite_loop_ends_with_the_wall_clock(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "while True:\n    pass\n",
        workdir=tmp_path,
        limits=Limits(wall_clock_seconds=1, cpu_seconds=10),
    )
    assert (outcome.status, outcome.limit) == ("limit", "wall_clock 1s")
    await assert_pool_works(pool, tmp_path)


async def test_memory_bomb_ends_with_the_memory_limit(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "hog = []\nwhile True:\n    hog.append(bytearray(50 << 20))\n",
        workdir=tmp_path,
        limits=Limits(memory_mb=768),
    )
    assert (outcome.status, outcome.limit) == ("limit", "memory 768MB")
    await assert_pool_works(pool, tmp_path)


async def test_fork_bomb_ends_with_the_process_limit_and_leaves_nothing(
    pool: RuntimePool, tmp_path: Path
) -> None:
    # Every process of the bomb carries this name (forks inherit it): found on the host by it.
    name = f"bomb{uuid.uuid4().hex[:10]}"
    outcome = await run(
        pool,
        f"import ctypes, os\nctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0)\nwhile True:\n    os.fork()\n",
        workdir=tmp_path,
        limits=Limits(max_processes=32, wall_clock_seconds=10),
    )
    assert (outcome.status, outcome.limit) == ("limit", "processes 32"), outcome.error
    assert await wait_until_gone(name) == []
    await assert_pool_works(pool, tmp_path)


async def test_writing_10_gb_ends_with_the_file_size_limit(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "chunk = b'x' * (1 << 20)\nwith open('huge.bin', 'wb') as out:\n"
        "    for _ in range(10 * 1024):\n        out.write(chunk)\n",
        workdir=tmp_path,
        limits=Limits(file_size_mb=8),
    )
    assert (outcome.status, outcome.limit) == ("limit", "file_size 8MB")
    assert (tmp_path / "huge.bin").stat().st_size <= 8 << 20
    await assert_pool_works(pool, tmp_path)


async def test_filling_tmp_is_capped_too(pool: RuntimePool, tmp_path: Path) -> None:
    """Many files each under the file size limit: /tmp (private under bwrap) is capped at it."""
    if pool.sandbox == "process":
        pytest.skip("the process backend has no /tmp (its TMPDIR is on disk, under the disk quota)")
    outcome = await run(
        pool,
        "import os\nchunk = b'x' * (1 << 20)\nwritten = 0\ntry:\n"
        "    for i in range(100):\n        with open(f'/tmp/f{i}', 'wb') as out:\n"
        "            for _ in range(4):\n                out.write(chunk)\n                written += 1\n"
        "except OSError as exc:\n    result([exc.errno, written])\n",
        workdir=tmp_path,
        limits=Limits(file_size_mb=8),
    )
    assert outcome.status == "ok", outcome.error
    error, written = json.loads(outcome.results[0])
    assert error == errno.ENOSPC
    # /tmp and /dev/shm share min(file size, memory / 4): half each, counted in the memory limit.
    assert written <= 4


async def test_printing_100_mb_keeps_a_capped_output(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "line = 'y' * 999\nfor _ in range(100_000):\n    print(line)\nresult('printed')\n",
        workdir=tmp_path,
        limits=Limits(stdout_bytes=10_000, wall_clock_seconds=60, cpu_seconds=60),
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.results == ["printed"]
    assert len(outcome.stdout) < 11_000
    assert "bytes truncated]" in outcome.stdout
    await assert_pool_works(pool, tmp_path)


@pytest.fixture
def server_stand_in() -> Iterator[int]:
    """A process started like the server: the secrets in its initial environment, the test's
    user. Its pid is what a block would aim at."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**SECRETS, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    try:
        deadline = time.monotonic() + 10
        while True:  # until it has exec'd; then the test is not vacuous: the secret is there
            with open(f"/proc/{proc.pid}/environ", "rb") as environ:
                if SECRETS["OPENAI_API_KEY"].encode() in environ.read():
                    break
            assert time.monotonic() < deadline, "the stand-in never started"
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


async def test_secrets_are_out_of_reach_through_proc(
    pool: RuntimePool, tmp_path: Path, server_stand_in: int
) -> None:
    if blocks_share_the_server_user(pool):
        pytest.skip("the stand-in runs as the blocks' own user here (the real server is non-dumpable)")
    code = f"""\
import os
found, errors = [], {{}}
targets = ['/proc/1/environ', '/proc/{server_stand_in}/environ', '/proc/{os.getpid()}/environ',
           '/proc/{server_stand_in}/cmdline', '/proc/{server_stand_in}/mem']
targets += [f'/proc/{{p}}/environ' for p in os.listdir('/proc') if p.isdigit()]
for path in targets:
    try:
        with open(path, 'rb') as f:
            data = f.read(1 << 20)
    except OSError as exc:
        errors[path] = type(exc).__name__
        continue
    for secret in {sorted(SECRETS.values())!r}:
        if secret.encode() in data:
            found.append(path)
result(found)
result(sorted(os.environ))
result(errors.get('/proc/{server_stand_in}/environ', 'read'))
"""
    outcome = await run(pool, code, workdir=tmp_path)
    assert outcome.status == "ok", outcome.error
    assert outcome.results[0] == "[]"
    extra = ["TMPDIR"] if pool.sandbox == "process" else []  # a private one
    assert json.loads(outcome.results[1]) == sorted(
        ["HOME", "LANG", "MPLBACKEND", "PATH", "PYTHONHASHSEED", *THREAD_POOLS, *extra]
    )
    # bwrap: the server's pid does not exist in the sandbox; process (as root): not readable.
    assert outcome.results[2] in ("FileNotFoundError", "PermissionError")
    await assert_pool_works(pool, tmp_path)


async def test_no_connection_to_the_services_own_port(pool: RuntimePool, tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        outcome = await run(
            pool,
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n    result('connected')\n"
            "except OSError as exc:\n    result(exc.errno)\n",
            workdir=tmp_path,
        )
    assert outcome.status == "ok", outcome.error
    # Both backends: the seccomp filter refuses every socket but AF_UNIX (and under bwrap the
    # sandbox has a loopback of its own besides: nothing listens there).
    assert outcome.results == [str(errno.EAFNOSUPPORT)]
    await assert_pool_works(pool, tmp_path)


async def test_no_connection_to_a_public_address(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
        "    result('connected')\nexcept OSError as exc:\n    result(exc.errno)\n"
        "try:\n    socket.getaddrinfo('example.com', 443)\n    result('resolved')\n"
        "except OSError as exc:\n    result(type(exc).__name__)\n"
        "result(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]))\n",
        workdir=tmp_path,
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.results[:2] == [str(errno.EAFNOSUPPORT), "gaierror"]
    if pool.sandbox == "bwrap":  # a network namespace of its own besides
        assert outcome.results[2] == '["lo"]'
    await assert_pool_works(pool, tmp_path)


async def test_ctypes_cannot_raise_limits_or_privileges(pool: RuntimePool, tmp_path: Path) -> None:
    if blocks_share_the_server_user(pool) and os.geteuid() == 0:
        pytest.skip("blocks run as root here")  # never: as root, blocks switch to nobody
    code = """\
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
class RLimit(ctypes.Structure):
    _fields_ = [('cur', ctypes.c_ulong), ('max', ctypes.c_ulong)]
raised = {}
for name in ('RLIMIT_NPROC', 'RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE'):
    which = getattr(resource, name)
    before = resource.getrlimit(which)
    wanted = RLimit(before[1] * 4 + 1000, before[1] * 4 + 1000)
    code = libc.setrlimit(which, ctypes.byref(wanted))
    raised[name] = [code, ctypes.get_errno(), resource.getrlimit(which) == before]
result(raised)
result([libc.setuid(0), libc.setgid(0)])
result(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))
result(libc.ptrace(16, os.getppid(), None, None))  # PTRACE_ATTACH to the worker
"""
    outcome = await run(pool, code, workdir=tmp_path, limits=Limits(max_processes=50))
    assert outcome.status == "ok", outcome.error
    raised = json.loads(outcome.results[0])
    assert raised == {name: [-1, errno.EPERM, True] for name in raised}
    assert outcome.results[1:] == ["[-1, -1]", "-1", "-1"]
    await assert_pool_works(pool, tmp_path)


async def test_kill_minus_one_spares_the_server_and_the_other_workers(
    pool: RuntimePool, tmp_path: Path
) -> None:
    if blocks_share_the_server_user(pool):
        pytest.skip("blocks run as the server's own user: kill -1 would kill the test (process backend)")
    await assert_pool_works(pool, tmp_path)
    workers = list(pool.workers.workers)
    outcome = await run(pool, "import os\nos.system('kill -9 -1')\nresult('alive')\n", workdir=tmp_path)
    if landlock.scopes_signals():
        # Its signals stay among its own processes: the shell's kill -1 took the block itself
        # down, and its worker lived to report that (not a worker lost mid-block).
        assert outcome.failure == "killed", (outcome.failure, outcome.error)
    else:
        assert outcome.status in ("ok", "error")  # under bwrap the block took its own sandbox down
    # The pool recycles the worker whose block was killed; every other one, and the zygote that
    # forks them all, lives on.
    assert len([w for w in workers if not w.dead]) >= len(workers) - 1
    assert all(z.proc.returncode is None for z in pool.workers.zygotes)
    for _ in range(3):
        await assert_pool_works(pool, tmp_path)


async def test_writing_outside_the_workdir_fails(pool: RuntimePool, tmp_path: Path) -> None:
    if blocks_share_the_server_user(pool):
        pytest.skip("blocks run as the server's own user: its files are theirs (process backend)")
    marker = f"sabre-escape-{uuid.uuid4().hex}"
    targets = [
        f"/etc/{marker}",
        f"/usr/{marker}",
        f"/{marker}",
        str(_PROJECT_ROOT / marker),
        str(_PROJECT_ROOT / "app" / marker),
        str(tmp_path.parent / marker),  # the workspaces directory itself
    ]
    # A checkout under /tmp is bound into the sandbox's own private /tmp, where a write to its
    # parent directory lands in that private tmpfs (gone with the block), not in the project.
    in_private_tmp = [t for t in targets if Path(t).is_relative_to("/tmp")]
    must_fail = [t for t in targets if t not in in_private_tmp]
    code = (
        "failed = []\n"
        f"for path in {must_fail!r}:\n"
        "    try:\n"
        "        with open(path, 'w') as out:\n"
        "            out.write('escaped')\n"
        "    except OSError as exc:\n"
        "        failed.append(exc.errno)\n"
        f"for path in {in_private_tmp!r}:\n"
        "    try:\n"
        "        with open(path, 'w') as out:\n"
        "            out.write('escaped')\n"
        "    except OSError:\n"
        "        pass\n"
        "result(failed)\n"
    )
    outcome = await run(pool, code, workdir=tmp_path)
    assert outcome.status == "ok", outcome.error
    failed = json.loads(outcome.results[0])
    assert len(failed) == len(must_fail)
    assert set(failed) <= {errno.EACCES, errno.EROFS, errno.ENOENT, errno.EPERM}
    # Whatever the code did, nothing reached the host's files.
    assert not [path for path in targets if _exists(path)]
    await assert_pool_works(pool, tmp_path)


@pytest.mark.parametrize("backend", ["bwrap", "process"])
async def test_the_code_cannot_write_into_the_servers_logs(
    backend: str, workspaces: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The worker logs to the server's stderr; a block gets neither that descriptor nor its
    parent's through /proc, so it cannot forge log lines."""
    if backend == "bwrap" and (why := await bwrap_unavailable(workspaces)) is not None:
        pytest.skip(f"bubblewrap cannot run here: {why}")
    marker = f"FORGED-LOG-LINE-{uuid.uuid4().hex}"
    code = f"""
import os
reached = []
for fd in range(3, 1024):
    try:
        os.write(fd, b"{marker}\\n")
        reached.append(fd)
    except OSError:
        pass
for pid in (os.getppid(), 1):
    for fd in (1, 2):
        try:
            with open(f"/proc/{{pid}}/fd/{{fd}}", "w") as log:
                log.write("{marker}\\n")
            reached.append(f"/proc/{{pid}}/fd/{{fd}}")
        except OSError:
            pass
result(reached)
"""
    async with RuntimePool(size=1, preload=(), sandbox=backend, workspaces=workspaces) as own:  # type: ignore[arg-type]
        if backend == "process" and own.sandbox_owner is None:
            pytest.skip("blocks run as the server's own user: /proc/<pid>/fd of its processes is theirs too")
        outcome = await run(own, code, workdir=tmp_path)
    assert outcome.status in ("ok", "error"), outcome.limit
    assert marker not in capfd.readouterr().err
