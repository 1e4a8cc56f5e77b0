"""Attacks of a block author on the sandbox, under both backends (the ``pool`` fixture).

Each case asserts the safe behaviour: the attacker hurts only its own block, another
conversation's blocks are unaffected and the pool keeps working. A case that found a real hole
is kept, marked ``xfail(strict=True, reason="HOLE: ...")`` (on the backends it affects), so that
it turns red the day the hole is fixed and the mark must go.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import structlog

from app.runtime import CallReply, Limits, RuntimePool
from tests.runtime.support import Recorder, assert_pool_works, host_processes_with, run, wait_until_gone

pytestmark = pytest.mark.asyncio(loop_scope="package")

# Frames as the code writes them (the wire format of app.runtime.protocol, by hand).
_FRAME = """\
import json, os, struct
def frame(header, blob=b""):
    data = json.dumps(header).encode()
    return struct.pack(">II", len(data), len(blob)) + data + blob
DONE = {"t": "done", "status": "ok", "results": ["forged"], "error": None, "limit": None,
        "dropped": [], "replayed": 0, "figures": []}
"""


def _marker() -> str:
    return f"atk{uuid.uuid4().hex[:10]}"  # comm holds 15 bytes


def _name_process(marker: str) -> str:
    return f"import ctypes\nctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)\n"


def _kill_marked(marker: str) -> None:
    for pid in host_processes_with(marker):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _conversation(workspaces: Path) -> Path:
    directory = workspaces / f"conv-{uuid.uuid4().hex[:12]}"
    directory.mkdir()
    return directory


def _hole(request: pytest.FixtureRequest, pool: RuntimePool, backends: tuple[str, ...], reason: str) -> None:
    """Mark the running case as a known hole on ``backends`` (strict: it must fail there)."""
    if pool.sandbox in backends:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"HOLE: {reason}"))


def _clear(directory: Path) -> None:
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))


def _exists(path: Path) -> bool:
    return os.path.exists(path)


async def _wait_for(path: Path, seconds: float = 5.0) -> None:
    """Wait until the block made ``path`` (it holds what it set out to hold)."""
    deadline = time.monotonic() + seconds
    while not _exists(path) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)


def _allocated(directory: Path) -> int:
    """Bytes allocated below ``directory`` (as root: modes do not hide anything)."""
    total = 0
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


async def _victim(pool: RuntimePool, workdir: Path, *, tag: str) -> None:
    """A victim block with an external call: its own result, output and call only."""
    recorder = Recorder(lambda call: CallReply(kind="value", value={"tag": tag}))
    outcome = await run(
        pool,
        f"answer = lookup(key={tag!r})\nprint('victim', {tag!r})\nresult(answer)",
        workdir=workdir,
        tools={"lookup": ["key"]},
        on_call=recorder,
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.stdout == f"victim {tag}\n"
    assert outcome.results == [json.dumps({"tag": tag})]
    assert [c.arguments for c in recorder.calls] == [{"key": tag}]


# -- the worker's relay ---------------------------------------------------------------------


async def test_a_block_that_lingers_after_done_does_not_hold_its_worker(
    pool: RuntimePool, workspaces: Path, request: pytest.FixtureRequest
) -> None:
    """A forged ``done`` (the block's own, believed) and then the process simply does not exit:
    the worker must not wait for it (the server waits 30 s for the ``exit`` frame, then
    recycles the worker). Two such blocks hold both workers: another conversation stalls."""
    marker = _marker()
    code = _FRAME + _name_process(marker) + "os.write(3, frame(DONE))\nimport time\ntime.sleep(120)\n"
    attacker, victim = _conversation(workspaces), _conversation(workspaces)
    try:
        for _ in range(2):  # one per worker of the pool
            outcome = await run(pool, code, workdir=attacker)
            assert (outcome.status, outcome.results) == ("ok", ["forged"])
        began = time.monotonic()
        try:
            async with asyncio.timeout(8):  # held, it would be 30 s (the exit frame's timeout)
                await _victim(pool, victim, tag="v1")
        except TimeoutError:
            pytest.fail(f"another conversation's block stalled {time.monotonic() - began:.1f}s")
    finally:
        _kill_marked(marker)
    await assert_pool_works(pool, victim)


async def test_a_forged_live_done_never_gets_another_conversations_block(
    pool: RuntimePool, workspaces: Path
) -> None:
    """A block forges ``done`` saying it stays live, then reads its channel for the next request:
    a process is bound to its own conversation only, so another conversation's block (its code,
    its tag) never reaches it, and that block runs as usual."""
    marker = _marker()
    code = (
        _FRAME
        + _name_process(marker)
        + "os.write(3, frame({**DONE, 'live': True}))\n"
        + "while True:\n"
        + "    data = os.read(3, 1 << 16)\n"
        + "    if not data:\n        break\n"
        + "    with open('stolen.bin', 'ab') as out:\n        out.write(data)\n"
    )
    attacker, victim = _conversation(workspaces), _conversation(workspaces)
    try:
        outcome = await run(pool, code, workdir=attacker)
        assert (outcome.status, outcome.results) == ("ok", ["forged"])
        for tag in ("v1", "v2", "v3"):
            await _victim(pool, victim, tag=tag)
        stolen = attacker / "stolen.bin"
        assert not stolen.exists() or b"victim" not in stolen.read_bytes()
    finally:
        _kill_marked(marker)
    await assert_pool_works(pool, victim)


async def test_a_done_with_a_garbage_live_flag_is_a_violation(pool: RuntimePool, workspaces: Path) -> None:
    """``live`` must be a boolean: anything else is the block breaking the protocol."""
    code = _FRAME + "os.write(3, frame({**DONE, 'live': 'yes'}))\nimport time\ntime.sleep(5)\n"
    outcome = await run(pool, code, workdir=_conversation(workspaces))
    assert outcome.status == "error"
    assert "broke the sandbox protocol" in (outcome.error or "")
    assert "live" in (outcome.error or "")
    await assert_pool_works(pool, _conversation(workspaces))


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
async def test_a_frame_with_a_number_json_does_not_have_is_a_violation(
    pool: RuntimePool, workspaces: Path, constant: str
) -> None:
    """Python's JSON reads NaN and Infinity, which no strict encoder writes: the worker, which
    encodes a ``done`` again, refuses the frame as the block breaking the protocol (before, the
    worker died on it and was replaced), and goes on serving."""
    code = _FRAME + (
        f'os.write(3, frame(DONE).replace(b\'"replayed": 0\', b\'"replayed": 0, "x": {constant}\'))\n'
        "import time\ntime.sleep(5)\n"
    )
    outcome = await run(pool, code, workdir=_conversation(workspaces))
    assert (outcome.status, outcome.failure) == ("error", "protocol_violation")
    assert "not a JSON number" in (outcome.error or "")
    await assert_pool_works(pool, _conversation(workspaces))


async def test_half_a_frame_after_done_then_exit_does_not_hold_the_worker(
    pool: RuntimePool, workspaces: Path, request: pytest.FixtureRequest
) -> None:
    """``done`` and two bytes of a next frame in one write, then the block exits while a fork of
    it (in a session of its own) keeps the channel open: the worker reads the done, then blocks
    in the middle of the next prefix and never sees the child die."""
    marker = _marker()
    code = _FRAME + (
        "import ctypes, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    ctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)\n"
        "    time.sleep(120)\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "os.write(3, frame(DONE) + b'\\x00\\x00')\n"
        "os._exit(0)\n"
    )
    attacker, victim = _conversation(workspaces), _conversation(workspaces)
    try:
        for _ in range(2):  # one per worker of the pool
            outcome = await run(pool, code, workdir=attacker)
            assert (outcome.status, outcome.results) == ("ok", ["forged"])
        began = time.monotonic()
        try:
            async with asyncio.timeout(3):
                await _victim(pool, victim, tag="v1")
        except TimeoutError:
            pytest.fail(f"another conversation's block stalled {time.monotonic() - began:.1f}s")
    finally:
        _kill_marked(marker)
    await assert_pool_works(pool, victim)


async def test_the_disk_quota_stops_a_slow_writer_within_a_few_polls(
    pool: RuntimePool, tmp_path: Path
) -> None:
    """The control of the two attacks below: the same writes, without blocking the worker, are
    stopped a few MB past the quota."""
    code = """\
import time
chunk = b"x" * (1 << 20)
for i in range(40):
    with open(f"fill{i}", "wb") as out:
        out.write(chunk)
    time.sleep(0.02)
"""
    outcome = await run(pool, code, workdir=tmp_path, limits=Limits(disk_mb=1, wall_clock_seconds=2))
    used = _allocated(tmp_path)
    _clear(tmp_path)
    assert (outcome.status, outcome.limit) == ("limit", "disk 1MB")
    assert used < 16 << 20


async def test_half_a_frame_while_running_does_not_suspend_the_disk_quota(
    pool: RuntimePool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The block announces a 1 MB header, sends one byte of it, and fills the disk slowly from
    another thread: the worker, blocked in the middle of the frame, no longer measures."""
    code = (
        _FRAME
        + """\
import struct, time
os.write(3, struct.pack(">II", 1 << 20, 0) + b"{")
chunk = b"x" * (1 << 20)
for i in range(40):
    with open(f"fill{i}", "wb") as out:
        out.write(chunk)
    time.sleep(0.02)
time.sleep(30)
"""
    )
    outcome = await run(pool, code, workdir=tmp_path, limits=Limits(disk_mb=1, wall_clock_seconds=2))
    used = _allocated(tmp_path)
    _clear(tmp_path)
    assert used < 16 << 20, f"{used >> 20} MB written under a 1 MB quota ({outcome.status} {outcome.limit})"
    assert (outcome.status, outcome.limit) == ("limit", "disk 1MB")
    await assert_pool_works(pool, tmp_path)


async def test_a_reply_the_block_never_reads_does_not_suspend_the_disk_quota(
    pool: RuntimePool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Forged calls whose (large) replies the block never reads: the worker blocks writing the
    reply to the child's full socket, and stops measuring the disk meanwhile."""
    recorder = Recorder(lambda call: CallReply(kind="value", value="r" * (4 << 20)))
    code = (
        _FRAME
        + """\
import time
call = {"name": "lookup", "runs": "caller", "args": [], "kwargs": {"key": "k"},
        "arguments": {"key": "k"}, "line": 1, "code": "x"}
os.write(3, frame({"t": "call", "digest": "0" * 64, "call": call}))
time.sleep(0.3)
chunk = b"x" * (1 << 20)
for i in range(40):
    with open(f"fill{i}", "wb") as out:
        out.write(chunk)
    time.sleep(0.02)
time.sleep(30)
"""
    )
    outcome = await run(
        pool,
        code,
        workdir=tmp_path,
        limits=Limits(disk_mb=1, wall_clock_seconds=2),
        tools={"lookup": ["key"]},
        on_call=recorder,
    )
    used = _allocated(tmp_path)
    _clear(tmp_path)
    assert used < 16 << 20, f"{used >> 20} MB written under a 1 MB quota ({outcome.status} {outcome.limit})"
    assert (outcome.status, outcome.limit) == ("limit", "disk 1MB")
    await assert_pool_works(pool, tmp_path)


# -- outliving the block ----------------------------------------------------------------------


async def test_a_daemon_dies_even_when_the_server_kills_the_worker(
    pool: RuntimePool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A daemon in a session of its own, then the block ignores its wall clock so that the
    server (not the worker) has to kill it: the worker's clean-up never runs."""
    marker = _marker()
    code = f"""\
import ctypes, os, signal, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)
        time.sleep(60)
    os._exit(0)
signal.signal(signal.SIGALRM, signal.SIG_IGN)
time.sleep(60)
"""
    try:
        outcome = await run(pool, code, workdir=tmp_path, limits=Limits(wall_clock_seconds=1))
        assert (outcome.status, outcome.limit) == ("limit", "wall_clock 1s")
        assert await wait_until_gone(marker, seconds=2) == []
    finally:
        _kill_marked(marker)
    await assert_pool_works(pool, tmp_path)


async def test_a_clone_parent_sibling_dies_with_the_block(pool: RuntimePool, tmp_path: Path) -> None:
    """clone(CLONE_PARENT) makes the new process the worker's own child (not the block's), and it
    leaves the block's session: the worker still kills it."""
    marker = _marker()
    code = f"""\
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CLONE_PARENT = 0x8000
pid = libc.syscall(56, CLONE_PARENT | signal.SIGCHLD, 0, 0, 0, 0)
if pid == 0:
    os.setsid()
    libc.prctl(15, {marker.encode()!r}, 0, 0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)
    os._exit(0)
result([pid > 0, ctypes.get_errno() if pid < 0 else 0])
time.sleep(0.3)
"""
    try:
        outcome = await run(pool, code, workdir=tmp_path)
        assert outcome.status == "ok", outcome.error
        assert await wait_until_gone(marker, seconds=3) == []
    finally:
        _kill_marked(marker)
    await assert_pool_works(pool, tmp_path)


async def test_a_storm_of_session_leaders_is_gone_after_the_block(pool: RuntimePool, tmp_path: Path) -> None:
    """Processes that keep forking into sessions of their own (each parent exits at once, so
    every one is an orphan by the time the block ends): the worker's clean-up stops and kills
    its whole tree, walk after walk, until none is left."""
    marker = _marker()
    code = f"""\
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
def storm(depth):
    if os.fork() == 0:
        os.setsid()
        libc.prctl(15, {marker.encode()!r}, 0, 0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            try:
                if os.fork() == 0:
                    continue  # the child forks on, the parent leaves it an orphan
            except OSError:
                pass
            os._exit(0)
for _ in range(4):
    storm(0)
time.sleep(0.3)
result('stormed')
"""
    try:
        outcome = await run(pool, code, workdir=tmp_path, limits=Limits(max_processes=40))
        assert outcome.status == "ok", outcome.error
        assert await wait_until_gone(marker, seconds=5) == []
    finally:
        _kill_marked(marker)
    await assert_pool_works(pool, tmp_path)


# -- other tenants' processes -------------------------------------------------------------------


async def test_one_blocks_processes_do_not_use_up_another_blocks_process_limit(
    pool: RuntimePool, workspaces: Path
) -> None:
    """RLIMIT_NPROC counts the processes of a user (of a user namespace): were blocks to share
    one, a block holding its limit's worth of processes would stop every other block forking."""
    attacker, victim = _conversation(workspaces), _conversation(workspaces)
    limits = Limits(max_processes=12, wall_clock_seconds=5)
    code = """\
import os, time
for _ in range(20):
    try:
        if os.fork() == 0:
            time.sleep(1.5)
            os._exit(0)
    except OSError:
        break
open("holding", "w").close()
time.sleep(1.5)
"""
    attack = asyncio.ensure_future(run(pool, code, workdir=attacker, limits=limits))
    try:
        await _wait_for(attacker / "holding")
        outcome = await run(
            pool,
            "import subprocess\nresult(subprocess.run(['true']).returncode)",
            workdir=victim,
            limits=limits,
        )
    finally:
        await attack
    assert (outcome.status, outcome.results) == ("ok", ["0"]), outcome.limit or outcome.error
    await assert_pool_works(pool, victim)


async def test_a_block_reaches_no_process_or_file_of_a_running_neighbour(
    pool: RuntimePool, workspaces: Path
) -> None:
    """While a victim block runs (a secret in its directory, its TMPDIR and its environment), the
    attacker scans /proc: /proc/<pid>/root, cwd and environ, signal 0 and a pidfd to every process
    named like the victim, and the process backend's directory of private TMPDIRs."""
    attacker, victim = _conversation(workspaces), _conversation(workspaces)
    marker = _marker()
    secret = f"secret-{uuid.uuid4().hex}"
    victim_code = (
        _name_process(marker)
        + f"""\
import os, tempfile, time
open("secret.txt", "w").write({secret!r})
open(os.path.join(tempfile.gettempdir(), "secret.txt"), "w").write({secret!r})
os.environ["VICTIM_SECRET"] = {secret!r}
open("running", "w").close()
time.sleep(1.5)
result("victim done")
"""
    )
    attack_code = f"""\
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
found, leaked, signalled = [], [], []
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
        continue
    try:
        comm = open(f"/proc/{{entry}}/comm").read().strip()
    except OSError:
        continue
    if comm != {marker!r}:
        continue
    found.append(entry)
    for path in (f"/proc/{{entry}}/root{victim}/secret.txt", f"/proc/{{entry}}/cwd/secret.txt",
                 f"/proc/{{entry}}/environ", f"/proc/{{entry}}/root/tmp/secret.txt"):
        try:
            leaked.append(open(path, "rb").read().decode(errors="replace"))
        except OSError:
            pass
    try:
        os.kill(int(entry), 0)
        signalled.append(("kill", entry))
    except OSError:
        pass
    fd = libc.syscall(434, int(entry), 0)  # pidfd_open
    if fd >= 0 and libc.syscall(424, fd, 0, None, 0) == 0:  # pidfd_send_signal(0)
        signalled.append(("pidfd", entry))
tmps = os.path.join({str(workspaces)!r}, ".sabre-tmp")
for root, dirs, files in os.walk(tmps):
    for name in files:
        try:
            leaked.append(open(os.path.join(root, name)).read())
        except OSError:
            pass
try:
    for name in os.listdir("/tmp"):
        try:
            leaked.append(open(os.path.join("/tmp", name)).read())
        except OSError:
            pass
except OSError:
    pass
result({{"leaked": leaked, "signalled": signalled}})
"""
    running = asyncio.ensure_future(run(pool, victim_code, workdir=victim))
    try:
        await _wait_for(victim / "running")
        outcome = await run(pool, attack_code, workdir=attacker)
    finally:
        victim_outcome = await running
    assert outcome.status == "ok", outcome.error
    assert secret not in (outcome.results[0] + outcome.stdout)
    assert json.loads(outcome.results[0])["signalled"] == []
    assert (victim_outcome.status, victim_outcome.results) == ("ok", ["victim done"])


async def test_a_directory_without_search_permission_hides_nothing_from_the_quota(
    pool: RuntimePool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Files opened first, then their directory made readable but not searchable (0600): the
    quota's walk lists the names but cannot stat them; the block writes on through its fds."""
    code = """\
import os, time
os.mkdir("hide")
fds = [os.open(f"hide/f{i}", os.O_WRONLY | os.O_CREAT, 0o600) for i in range(24)]
os.chmod("hide", 0o600)
chunk = b"x" * (1 << 20)
for fd in fds:
    os.write(fd, chunk)
    time.sleep(0.02)
result("written")
"""
    try:
        outcome = await run(pool, code, workdir=tmp_path, limits=Limits(disk_mb=1))
        used = _allocated(tmp_path)
    finally:
        os.chmod(tmp_path / "hide", 0o700)
        _clear(tmp_path / "hide")
    assert used < 16 << 20, f"{used >> 20} MB written under a 1 MB quota ({outcome.status} {outcome.limit})"
    assert (outcome.status, outcome.limit) == ("limit", "disk 1MB")


async def test_files_outside_the_measured_directories_are_refused_or_memory(
    pool: RuntimePool, tmp_path: Path
) -> None:
    """Where else could a block put bytes the quota does not see: /dev/shm, /tmp, /var/tmp, the
    workspaces directory, its own directory through /proc/self/cwd/.. (process: Landlock refuses
    them; bwrap: /tmp and /dev/shm are the block's own small tmpfs, the rest is read-only)."""
    code = f"""\
import os, tempfile
written = []
for directory in ("/dev/shm", "/var/tmp", {str(tmp_path.parent)!r}, "/proc/self/cwd/..", "/", "/dev"):
    try:
        with open(os.path.join(directory, "escape.bin"), "wb") as out:
            out.write(b"x" * 4096)
        written.append(directory)
    except OSError:
        pass
result(written)
result(tempfile.gettempdir())
"""
    outcome = await run(pool, code, workdir=tmp_path)
    assert outcome.status == "ok", outcome.error
    written = json.loads(outcome.results[0])
    if pool.sandbox == "bwrap":
        assert set(written) <= {"/dev/shm"}  # the block's own tmpfs, counted as its memory
    else:
        assert written == []
    assert not _exists(tmp_path.parent / "escape.bin")
    assert not _exists(Path("/var/tmp/escape.bin"))


# -- frames the server must not believe ------------------------------------------------------


async def test_a_done_whose_figure_sizes_lie_fails_only_its_block(pool: RuntimePool, tmp_path: Path) -> None:
    """Figure sizes larger than the blob, and a "figure" that is not a PNG."""
    for figures, blob in (("[100]", "b'x' * 50"), ("[8]", "b'snapshotNOTAPNG!'")):
        code = _FRAME + (
            f"os.write(3, frame(dict(DONE, figures={figures}), {blob}))\nimport time\ntime.sleep(5)\n"
        )
        outcome = await run(pool, code, workdir=tmp_path)
        assert outcome.status == "error", (figures, outcome)
        assert outcome.error is not None
        assert "SandboxError" in outcome.error
        assert outcome.failure == "protocol_violation"
    await assert_pool_works(pool, tmp_path)


async def test_a_half_frame_then_a_reset_channel_fails_only_its_block(
    pool: RuntimePool, workspaces: Path
) -> None:
    """A reply left unread in the child's socket makes its close a reset (ECONNRESET, not EOF)
    on the worker's side: four bytes of a prefix, then the child dies."""
    attacker, victim = _conversation(workspaces), _conversation(workspaces)
    code = (
        _FRAME
        + """\
import time
call = {"name": "lookup", "runs": "caller", "args": [], "kwargs": {"key": "k"},
        "arguments": {"key": "k"}, "line": 1, "code": "x"}
os.write(3, frame({"t": "call", "digest": "0" * 64, "call": call}))
time.sleep(0.3)
os.write(3, b"\\x00\\x00\\x00\\x10")
os._exit(0)
"""
    )
    outcome = await run(pool, code, workdir=attacker, tools={"lookup": ["key"]})
    # (A worker hung by its quota watchdog once made this a wall-clock limit after 30 s:
    # test_relay_watchdog holds that fix; the rest of the outcome says where, should it recur.)
    assert outcome.status == "error", (outcome.limit, outcome.error, outcome.failure, outcome.duration_ms)
    await _victim(pool, victim, tag="after-reset")
    await assert_pool_works(pool, victim)


async def test_calls_interleaved_with_pending_replies_stay_in_their_block(
    pool: RuntimePool, workspaces: Path
) -> None:
    """Three calls sent at once (no reply read in between), from the block and a fork of it,
    while a victim runs: the replies go only to the attacker's block, the victim's to the
    victim."""
    attacker, victim = _conversation(workspaces), _conversation(workspaces)
    code = (
        _FRAME
        + """\
import time
def call(key):
    c = {"name": "lookup", "runs": "caller", "args": [], "kwargs": {"key": key},
         "arguments": {"key": key}, "line": 1, "code": "x"}
    return frame({"t": "call", "digest": "0" * 64, "call": c})
os.write(3, call("a1") + call("a2"))
if os.fork() == 0:
    os.write(3, call("a3"))
    os._exit(0)
time.sleep(0.5)
got = b""
while len(got) < 3:
    got += os.read(3, 1 << 16)
time.sleep(0.2)
os.write(3, frame(dict(DONE, results=[str(len(got))])))
os._exit(0)
"""
    )
    recorder = Recorder(lambda call: CallReply(kind="value", value={"for": "attacker"}))
    attack = asyncio.ensure_future(
        run(pool, code, workdir=attacker, tools={"lookup": ["key"]}, on_call=recorder)
    )
    try:
        await _victim(pool, victim, tag="interleaved")
    finally:
        outcome = await attack
    assert {c.arguments["key"] for c in recorder.calls} <= {"a1", "a2", "a3"}
    assert outcome.status in ("ok", "error")
    await assert_pool_works(pool, victim)


# -- seccomp ------------------------------------------------------------------------------------


async def test_seccomp_holds_in_every_block(pool: RuntimePool, tmp_path: Path) -> None:
    """clone3 (its flags are out of the filter's sight): ENOSYS; clone with CLONE_NEWUSER and
    personality(READ_IMPLIES_EXEC): EPERM; i386's int 0x80 kills the process (run in a fork)."""
    if os.uname().machine != "x86_64":
        pytest.skip("the system call numbers are x86_64's")
    code = """\
import ctypes, mmap, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
args = (ctypes.c_uint64 * 11)(0x10000000, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, 0)
out["clone3"] = ctypes.get_errno() if libc.syscall(435, args, 88) == -1 else "allowed"
newuser = libc.syscall(56, 0x10000000 | signal.SIGCHLD, 0, 0, 0, 0)
out["clone_newuser"] = ctypes.get_errno() if newuser == -1 else "allowed"
out["personality"] = ctypes.get_errno() if libc.syscall(135, 0x0400000) == -1 else "allowed"
out["personality_high"] = ctypes.get_errno() if libc.syscall(135, 0x1_0040_0000) == -1 else "allowed"
pid = os.fork()
if pid == 0:
    # getpid through int 0x80 (i386's entry point), from executable memory.
    code = b"\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3"  # mov eax, 20; int 0x80; ret
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    ctypes.CFUNCTYPE(ctypes.c_long)(address)()
    os._exit(0)
_, status = os.waitpid(pid, 0)
out["int80"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
result(out)
"""
    outcome = await run(pool, code, workdir=tmp_path)
    assert outcome.status == "ok", outcome.error
    seen = json.loads(outcome.results[0])
    assert seen == {
        "clone3": 38,  # ENOSYS
        "clone_newuser": 1,  # EPERM
        "personality": 1,
        "personality_high": 1,
        "int80": int(signal.SIGSYS),
    }
    await assert_pool_works(pool, tmp_path)


async def test_an_honest_block_that_ends_is_never_a_violation(pool: RuntimePool, workspaces: Path) -> None:
    """The guard against frames after ``done`` must not fire when the child just exits: its
    channel then reads as end-of-file, which is how every block ends (after an error too)."""
    workdir = _conversation(workspaces)
    with structlog.testing.capture_logs() as logs:
        for code in ("print('fine')", "raise ValueError('boom')", "import sys\nsys.exit(3)"):
            await run(pool, code, workdir=workdir)
        await assert_pool_works(pool, workdir)
        await asyncio.sleep(0.3)  # the worker reports the child's exit after the block's outcome
    assert [e for e in logs if e["event"] == "sandbox_protocol_violation"] == []


_SWAPPER = """\
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
RENAME_EXCHANGE, AT_FDCWD = 2, -100
renameat2 = 316 if os.uname().machine == "x86_64" else 276
os.makedirs("sub/etc")
os.chmod("sub/etc", 0o077)  # closed: the quota's walk opens it up again
real = os.open("sub", os.O_RDONLY | os.O_DIRECTORY)
os.symlink({target!r}, "lnk")
children = []
for _ in range(2):  # helpers: only the block's own process is CPU-limited
    pid = os.fork()
    if pid == 0:
        started = time.monotonic()
        while time.monotonic() - started < 1.5:
            libc.syscall(renameat2, AT_FDCWD, b"sub", AT_FDCWD, b"lnk", RENAME_EXCHANGE)
            if os.stat("etc", dir_fd=real).st_mode & 0o700:
                os.chmod("etc", 0o077, dir_fd=real)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
result("swapped")
"""


async def test_the_quota_walk_never_follows_a_link_the_block_swaps_in(
    pool: RuntimePool, workspaces: Path
) -> None:
    """While the worker measures its directory, a block keeps exchanging a directory it closed
    with a symbolic link to another conversation's (renameat2 RENAME_EXCHANGE): the walk, which
    opens up closed directories, must neither change the other's mode nor count its files (it
    went by path: the other directory became 0777, and with a root worker any host directory)."""
    victim = _conversation(workspaces)
    target = victim / "etc"
    target.mkdir(mode=0o755)
    owner = pool.owner_of(victim)
    if owner is not None:  # as the service leaves it: the sandbox user's, like the worker
        for path in (victim, target):
            os.chown(path, owner.uid, owner.gid)
    attacker = _conversation(workspaces)
    code = _SWAPPER.format(target=str(victim))
    outcome = await run(pool, code, workdir=attacker, limits=Limits(disk_mb=64))
    assert (outcome.status, outcome.results) == ("ok", ["swapped"]), (outcome.error, outcome.limit)
    assert oct(target.stat().st_mode & 0o777) == oct(0o755)
