"""One tenant's block can never see or steer another's (issue 10): every case runs under both
backends (the ``pool`` fixture), with an attacker block and victim blocks of another
conversation on the same two-worker pool.

The attacker forges frames of the current protocol and garbage on every descriptor it can find;
it must only ever affect its own block.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import pickle
import signal
import socket
import uuid
from pathlib import Path

import pytest

from app.runtime import CallReply, HelperCall, Limits, RuntimePool
from tests.runtime.support import Recorder, assert_pool_works, run, wait_until_gone

pytestmark = pytest.mark.asyncio(loop_scope="package")

# Frames as the code writes them (the wire format of app.runtime.protocol, by hand: a block has
# nothing of the runtime to import them from).
_FRAME = """\
import json, os, struct
def frame(header, blob=b""):
    data = json.dumps(header).encode()
    return struct.pack(">II", len(data), len(blob)) + data + blob
"""


def _exists(path: Path) -> bool:
    return path.exists()


def _size_and_clear(directory: Path) -> int:
    """The bytes of the files in ``directory``, which is emptied."""
    total = 0
    for leftover in directory.iterdir():
        total += leftover.stat().st_size
        leftover.unlink()
    return total


def _conversation(workspaces: Path) -> Path:
    directory = workspaces / f"conv-{uuid.uuid4().hex[:12]}"
    directory.mkdir()
    return directory


async def _victim_blocks(pool: RuntimePool, workdir: Path, *, rounds: int = 4) -> None:
    """The victim's blocks: a secret in the namespace, an external tool; each result is its own."""
    first = await run(pool, "secret = 'b-secret-123'\nresult('set')", workdir=workdir)
    assert first.status == "ok", first.error
    snapshot = first.snapshot
    for index in range(rounds):
        recorder = Recorder(lambda call: CallReply(kind="value", value={"order": "W1"}))
        outcome = await run(
            pool,
            f"order = get_order(order_id='W{index}')\nprint('victim', {index})\nresult([secret, order])",
            workdir=workdir,
            snapshot=snapshot,
            tools={"get_order": ["order_id"]},
            on_call=recorder,
        )
        assert outcome.status == "ok", outcome.error
        assert outcome.stdout == f"victim {index}\n"
        assert outcome.results == ['["b-secret-123", {"order": "W1"}]']
        assert [(c.name, c.arguments) for c in recorder.calls] == [("get_order", {"order_id": f"W{index}"})]


async def test_forged_frames_on_every_descriptor_reach_no_other_block(
    pool: RuntimePool, workspaces: Path
) -> None:
    """The takeover of the review: ``done`` for its own block, then ``exit`` and ``ready`` as if it
    were the worker, on every descriptor; then wait for the next request to read it."""
    attacker, victim = _conversation(workspaces), _conversation(workspaces)
    code = (
        _FRAME
        + """\
import select, time
done = frame({"t": "done", "status": "ok", "stdout": "FAKE", "results": ["FAKE OUTPUT"], "error": None,
              "limit": None, "dropped": [], "replayed": 0, "figures": []})
exit_ = frame({"t": "exit", "pid": os.getpid(), "code": 0, "signal": None, "cpu_seconds": 0.0})
ready = frame({"t": "ready", "pid": 424242})
arguments = {"order_id": "ATTACKER-CHOSEN"}
call = frame({"t": "call", "digest": "0" * 64, "call": {"name": "refund_order", "runs": "caller",
              "args": [], "kwargs": arguments, "arguments": arguments, "line": 1, "code": "x"}})
fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
for fd in fds:
    for data in (done + exit_ + ready, call, b"\\x00\\x00\\x00\\x05garbage"):
        try:
            os.write(fd, data)
        except OSError:
            pass
readable = [fd for fd in fds if fd > 2]
deadline = time.monotonic() + 3
stolen = b""
while time.monotonic() < deadline:
    try:
        ready_fds, _, _ = select.select(readable, [], [], 0.1)
    except OSError:
        break
    for fd in ready_fds:
        try:
            stolen += os.read(fd, 1 << 20)
        except OSError:
            pass
print("STOLEN", stolen)
"""
    )
    for _ in range(3):  # with two workers the attacker needed two tries: give it three
        outcome = await run(pool, code, workdir=attacker, limits=Limits(wall_clock_seconds=5))
        # Whatever the block claimed for itself, nothing of another block's request reached it.
        assert b"b-secret-123" not in (outcome.stdout or "").encode()
        assert "b-secret" not in json.dumps(outcome.results)
        await _victim_blocks(pool, victim, rounds=2)
    await assert_pool_works(pool, victim)


async def test_a_block_holds_only_its_own_descriptors(pool: RuntimePool, tmp_path: Path) -> None:
    """0, 1 and 2 (/dev/null, the output pipe) and its own channel: nothing of the worker's
    pipes to the server, its log, a namespace handle or the server's own descriptors."""
    code = """\
import os, stat
fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    except OSError:
        pass  # the listing's own descriptor, closed already
fds = {fd: target for fd, target in fds.items() if not target.startswith("/proc")}
result({fd: target.split(":")[0] for fd, target in sorted(fds.items())})
result(os.get_inheritable(3))
"""
    outcome = await run(pool, code, workdir=tmp_path)
    assert outcome.status == "ok", outcome.error
    assert json.loads(outcome.results[0]) == {"0": "/dev/null", "1": "pipe", "2": "pipe", "3": "socket"}
    assert outcome.results[1] == "False"  # a program the code runs does not get the channel


async def test_garbage_on_its_own_channel_fails_only_that_block(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool, "import os\nos.write(3, os.urandom(64))\nimport time\ntime.sleep(5)", workdir=tmp_path
    )
    assert outcome.status == "error"
    assert outcome.error is not None
    assert "broke the sandbox protocol" in outcome.error
    await assert_pool_works(pool, tmp_path)


async def test_a_forged_exit_frame_is_not_believed(pool: RuntimePool, tmp_path: Path) -> None:
    """A block that used no CPU cannot have itself reported as ``limit: cpu_time``."""
    code = _FRAME + (
        "os.write(3, frame({'t': 'exit', 'pid': os.getpid(), 'code': None, 'signal': "
        f"{int(signal.SIGXCPU)}, 'cpu_seconds': 99.0}}))\nimport time\ntime.sleep(5)\n"
    )
    outcome = await run(pool, code, workdir=tmp_path)
    assert (outcome.status, outcome.limit) == ("error", None)
    assert outcome.error is not None
    assert "broke the sandbox protocol" in outcome.error
    assert "'exit'" in outcome.error
    await assert_pool_works(pool, tmp_path)


async def test_anything_after_done_kills_the_block(pool: RuntimePool, tmp_path: Path) -> None:
    """A forged ``done`` speaks for the block's own outcome only; a frame after it is a violation,
    and the process that sent it does not outlive the block."""
    marker = f"afterdone{uuid.uuid4().hex[:8]}"
    code = (
        _FRAME
        + f"""\
import ctypes, time
ctypes.CDLL(None).prctl(15, b"{marker}", 0, 0, 0)
os.write(3, frame({{"t": "done", "status": "ok", "results": ["mine"], "error": None, "limit": None,
                   "dropped": [], "replayed": 0, "figures": []}}))
os.write(3, frame({{"t": "ready", "pid": 7}}))
time.sleep(30)
"""
    )
    outcome = await run(pool, code, workdir=tmp_path)
    assert (outcome.status, outcome.results) == ("ok", ["mine"])
    assert await wait_until_gone(marker) == []
    await assert_pool_works(pool, tmp_path)


async def test_a_block_cannot_flood_the_server_with_journal_records(
    pool: RuntimePool, tmp_path: Path
) -> None:
    """40 records of 10 MB each (the review's 470 MB of server memory): the block is stopped at
    the journal's cap, long before."""
    code = (
        _FRAME
        + """\
value = "x" * (10 << 20)
for index in range(40):
    os.write(3, frame({"t": "record", "name": "FS.read_file", "digest": "%064d" % index, "value": value,
                       "error_type": None, "error_message": None}))
result("flooded")
"""
    )
    outcome = await run(pool, code, workdir=tmp_path, limits=Limits(memory_mb=1024, wall_clock_seconds=20))
    assert outcome.status == "error", (outcome.limit, outcome.failure, outcome.duration_ms, outcome.results)
    assert outcome.error is not None
    assert "journal" in outcome.error
    assert len(outcome.journal) <= 4
    await assert_pool_works(pool, tmp_path)


async def test_the_server_never_unpickles_what_a_block_sends(pool: RuntimePool, tmp_path: Path) -> None:
    """A block's snapshot is carried and stored, opaque: a pickle that would run code when loaded
    runs nothing in the server."""
    marker = Path(f"/var/tmp/sabre-unpickled-{uuid.uuid4().hex}")

    class Bomb:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    bomb = pickle.dumps(Bomb())
    code = _FRAME + (
        f"os.write(3, frame({{'t': 'done', 'status': 'ok', 'results': [], 'error': None, 'limit': None, "
        f"'dropped': [], 'replayed': 0, 'figures': []}}, {bomb!r}))\nimport time\ntime.sleep(5)\n"
    )
    outcome = await run(pool, code, workdir=tmp_path)
    assert outcome.status == "ok", outcome.error
    assert outcome.snapshot == bomb
    assert not _exists(marker)


async def test_a_daemon_the_block_starts_is_gone_when_the_block_ends(
    pool: RuntimePool, tmp_path: Path
) -> None:
    """Double fork and a session of its own: re-parented to the worker (its subreaper) or left in
    the PID namespace, it is killed with the block."""
    marker = f"daemon{uuid.uuid4().hex[:10]}"
    code = f"""\
import ctypes, os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(15, b"{marker}", 0, 0, 0)
        time.sleep(60)
    os._exit(0)
time.sleep(0.3)
result("started")
"""
    outcome = await run(pool, code, workdir=tmp_path)
    assert outcome.status == "ok", outcome.error
    assert await wait_until_gone(marker) == []
    await assert_pool_works(pool, tmp_path)


async def test_a_block_cannot_read_the_store_or_another_conversation(
    pool: RuntimePool, workspaces: Path
) -> None:
    """The data directory holds the store and every conversation's folder: a block reads and
    writes only its own (process backend: Landlock; bwrap: its mount namespace)."""
    mine, other = _conversation(workspaces), _conversation(workspaces)
    (other / "private.txt").write_text("other tenant's data")
    store = workspaces / "sabre-store.db"  # the data directory's files sit next to the workspaces
    store.write_text("every tenant's messages")
    store.chmod(0o644)
    code = f"""\
import os
outcome = {{}}
for path in ({str(other / "private.txt")!r}, {str(store)!r}):
    try:
        outcome[path] = open(path).read()
    except OSError as exc:
        outcome[path] = exc.errno
try:
    open({str(other / "planted.txt")!r}, "w").write("x")
    outcome["plant"] = "planted"
except OSError as exc:
    outcome["plant"] = exc.errno
try:
    outcome["list"] = os.listdir({str(workspaces)!r})
except OSError as exc:
    outcome["list"] = exc.errno
result(outcome)
"""
    try:
        outcome = await run(pool, code, workdir=mine)
    finally:
        store.unlink()
    assert outcome.status == "ok", outcome.error
    seen = json.loads(outcome.results[0])
    assert "other tenant's data" not in outcome.results[0]
    assert "every tenant's messages" not in outcome.results[0]
    assert seen["plant"] != "planted"
    assert not (other / "planted.txt").exists()
    assert other.name not in json.dumps(seen["list"])


async def test_tmp_is_private_to_the_block(pool: RuntimePool, tmp_path: Path, workspaces: Path) -> None:
    """A file a block leaves in its temporary directory is not seen by a later block."""
    name = f"left-{uuid.uuid4().hex}"
    code = (
        "import os, tempfile\npath = os.path.join(tempfile.gettempdir(), "
        f"{name!r})\nfound = os.path.exists(path)\nopen(path, 'w').write('x')\nresult([found, path])\n"
    )
    first = await run(pool, code, workdir=tmp_path)
    assert first.status == "ok", first.error
    second = await run(pool, code, workdir=_conversation(workspaces))
    assert second.status == "ok", second.error
    assert json.loads(second.results[0])[0] is False
    assert not _exists(Path("/tmp", name))


async def test_no_network_sockets_and_no_kernel_surface(pool: RuntimePool, tmp_path: Path) -> None:
    """seccomp: no socket but AF_UNIX, no io_uring, bpf, perf_event_open, keyctl, userfaultfd,
    unshare, ptrace."""
    code = """\
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
out = {}
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    out["inet"] = "created"
except OSError as exc:
    out["inet"] = exc.errno
a, b = socket.socketpair()
out["socketpair"] = "ok"
params = ctypes.create_string_buffer(120)
for name, number, args in [("io_uring_setup", 425, (1, params)), ("bpf", 321, (0, None, 0)),
                           ("perf_event_open", 298, (None, 0, -1, -1, 0)), ("keyctl", 250, (0, 0)),
                           ("userfaultfd", 323, (0,)), ("unshare", 272, (0x10000000,)),
                           ("ptrace", 101, (0, 0, 0, 0))]:
    code = libc.syscall(number, *args)
    out[name] = ctypes.get_errno() if code == -1 else "allowed"
result(out)
"""
    if os.uname().machine != "x86_64":
        pytest.skip("the syscall numbers in this test are x86_64's")
    outcome = await run(pool, code, workdir=tmp_path)
    assert outcome.status == "ok", outcome.error
    seen = json.loads(outcome.results[0])
    assert seen.pop("inet") == errno.EAFNOSUPPORT
    assert seen.pop("socketpair") == "ok"
    assert seen == dict.fromkeys(seen, errno.EPERM)


async def test_no_connection_to_a_host_unix_socket(
    pool: RuntimePool, tmp_path: Path, workspaces: Path
) -> None:
    """A listening unix socket of the host (PostgreSQL's, Redis's) is out of reach."""
    path = str(workspaces / f"host-{uuid.uuid4().hex[:8]}.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        try:
            outcome = await run(
                pool,
                "import socket\ntry:\n    s = socket.socket(socket.AF_UNIX)\n"
                f"    s.connect({path!r})\n    result('connected')\n"
                "except OSError as exc:\n    result(type(exc).__name__)\n",
                workdir=tmp_path,
            )
        finally:
            os.unlink(path)
    assert outcome.status == "ok", outcome.error
    assert outcome.results != ["connected"]


async def test_disk_quota_stops_a_block_filling_the_disk(pool: RuntimePool, tmp_path: Path) -> None:
    code = "chunk = b'x' * (1 << 20)\nfor i in range(300):\n    open(f'f{i}', 'wb').write(chunk)\n"
    outcome = await run(pool, code, workdir=tmp_path, limits=Limits(disk_mb=20))
    assert (outcome.status, outcome.limit) == ("limit", "disk 20MB")
    assert _size_and_clear(tmp_path) < 300 << 20
    await assert_pool_works(pool, tmp_path)


async def test_file_quota_stops_a_block_making_files(pool: RuntimePool, tmp_path: Path) -> None:
    code = "import os\nos.mkdir('many')\nfor i in range(30_000):\n    open(f'many/f{i}', 'w').close()\n"
    outcome = await run(pool, code, workdir=tmp_path, limits=Limits(disk_files=500))
    assert (outcome.status, outcome.limit) == ("limit", "disk_files 500")
    assert len(os.listdir(tmp_path / "many")) < 30_000


async def test_a_block_over_quota_may_still_clean_up(pool: RuntimePool, tmp_path: Path) -> None:
    for index in range(30):
        (tmp_path / f"old{index}").write_bytes(b"x" * (1 << 20))
    outcome = await run(
        pool,
        "import os\nfor name in os.listdir('.'):\n    os.remove(name)\nresult(len(os.listdir('.')))",
        workdir=tmp_path,
        limits=Limits(disk_mb=10),
    )
    assert (outcome.status, outcome.results) == ("ok", ["0"])


async def test_a_block_over_quota_at_its_start_may_not_grow(pool: RuntimePool, tmp_path: Path) -> None:
    """The worker measures a fresh block's directory before the block gets its code: what the code
    writes first counts. (The walk reaches ``many/last/big`` after 3,000 other files, milliseconds
    in: a baseline taken while the block starts would include its write, and let it grow.)"""
    (tmp_path / "many" / "last").mkdir(parents=True)
    for index in range(3000):
        (tmp_path / "many" / str(index)).touch()
    (tmp_path / "many" / "last" / "big").write_bytes(b"x" * (12 << 20))
    (tmp_path / "many" / "last" / "big").chmod(0o666)  # the block's user may not be the test's
    outcome = await run(
        pool,
        "open('many/last/big', 'ab').write(b'y' * (2 << 20))\nresult('wrote')",
        workdir=tmp_path,
        limits=Limits(disk_mb=10),
    )
    assert (outcome.status, outcome.limit) == ("limit", "disk 10MB"), outcome.error


async def test_calls_of_a_victim_are_never_made_by_an_attacker(pool: RuntimePool, workspaces: Path) -> None:
    """A well-formed call frame on its own channel names only its own block's tools."""
    attacker = _conversation(workspaces)
    recorder = Recorder()
    code = (
        _FRAME
        + """\
os.write(3, frame({"t": "call", "digest": "0" * 64, "call": {"name": "refund_order", "runs": "caller",
                   "args": [], "kwargs": {}, "arguments": {"order_id": "ATTACKER-CHOSEN"}, "line": 1,
                   "code": "x"}}))
import time
time.sleep(5)
"""
    )
    outcome = await run(pool, code, workdir=attacker, on_call=recorder)
    assert outcome.status == "error"
    assert recorder.calls == []
    calls: list[HelperCall] = recorder.calls
    assert not calls


_STEER = """\
import ctypes, errno, json, os, resource
me = os.getpid()
libc = ctypes.CDLL(None, use_errno=True)
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
def ioprio(pid):  # ioprio_set(IOPRIO_WHO_PROCESS, pid, class idle)
    if libc.syscall({ioprio_set}, 1, pid, 3 << 13) != 0:
        raise OSError(ctypes.get_errno(), "ioprio_set")
steered = {{}}
for pid in sorted(set(range(2, 400)) | {{{server}}}):
    if pid == me:
        continue
    tried = {{
        "renice": attempt(lambda: os.setpriority(os.PRIO_PROCESS, pid, 19)),
        "renice group": attempt(lambda: os.setpriority(os.PRIO_PGRP, pid, 19)),
        "pin": attempt(lambda: os.sched_setaffinity(pid, {{0}})),
        "idle policy": attempt(lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))),
        "cpu limit": attempt(lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1))),
        "read limits": attempt(lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE)),
        "read nice": attempt(lambda: os.getpriority(os.PRIO_PROCESS, pid)),
        "io priority": attempt(lambda: ioprio(pid)),
    }}
    if "ok" in tried.values():
        steered[pid] = tried
steered["user"] = attempt(lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19))
# Its own process stays its own to steer.
files = resource.getrlimit(resource.RLIMIT_NOFILE)
own = [
    attempt(lambda: os.setpriority(os.PRIO_PROCESS, 0, 1)),
    attempt(lambda: os.sched_setaffinity(0, os.sched_getaffinity(0))),
    attempt(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, files)),
]
result(json.dumps({{"steered": steered, "own": own}}))
"""

_VICTIM = """\
import os, resource, time
started = time.monotonic()
while time.monotonic() - started < {seconds}:
    pass
state = [os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), sorted(os.sched_getaffinity(0))]
result(state + [resource.getrlimit(resource.RLIMIT_CPU)])
"""


async def test_a_block_cannot_steer_other_processes_by_pid(pool: RuntimePool, tmp_path: Path) -> None:
    """Blocks of other conversations run beside an attacker as the same user (under bwrap in the
    PID namespace of the zygote they share; under the process backend beside the server): by
    guessing pids it can neither renice, pin, deschedule nor limit them (nor its worker, the
    zygote or the server), nor read their nice value or limits; its own process it still may."""
    victim_dir, attacker_dir = (
        _conversation(pool.workspaces or tmp_path),
        _conversation(pool.workspaces or tmp_path),
    )
    before = (os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)))
    victim = asyncio.ensure_future(run(pool, _VICTIM.format(seconds=1.5), workdir=victim_dir))
    await asyncio.sleep(0.5)  # the victim runs while the attacker aims at every pid
    code = _STEER.format(ioprio_set=251 if os.uname().machine == "x86_64" else 30, server=os.getpid())
    attacker = await run(pool, code, workdir=attacker_dir)
    assert attacker.status == "ok", attacker.error
    report = json.loads(attacker.results[0])
    assert report["steered"] == {"user": "EPERM"}, report["steered"]
    assert report["own"] == ["ok", "ok", "ok"]
    untouched = await victim
    assert untouched.status == "ok", untouched.error
    nice, policy, cpus, cpu_limit = json.loads(untouched.results[0])
    assert (nice, policy, cpus) == (0, os.SCHED_OTHER, before[1])
    assert cpu_limit[0] != 1
    assert (os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0))) == before
