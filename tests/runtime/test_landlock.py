"""Landlock for the sandbox child (``app.runtime.landlock``), enforced in forked children.

Each test forks the test process, checks that the operation works before ``restrict`` (these
tests run as root, and Landlock must deny root too: a denial seen only after ``restrict`` is
Landlock's), restricts the child and tries again; the parent asserts.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from app.runtime import landlock
from tests.runtime.support import in_child

ABI = landlock.abi()
pytestmark = pytest.mark.skipif(ABI < 1, reason="Landlock is not available in this kernel")

# What a child needs to run programs: the system's and Python's files, read-only.
_SYSTEM = ("/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache", sys.base_prefix, sys.prefix)


def outcome(action: Callable[[], object]) -> str:
    """ "ok", or the errno name of the OSError the action raised."""
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return "ok"


def _read(path: Path) -> Callable[[], object]:
    return path.read_bytes


def _write(path: Path) -> Callable[[], object]:
    return lambda: path.write_bytes(b"written")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """ro/ (a file, a subdirectory with a file), rw/ (a file), outside/ (a file), lone.txt."""
    for name in ("ro/sub", "rw", "outside"):
        (tmp_path / name).mkdir(parents=True)
    for name in (
        "ro/file.txt",
        "ro/sub/deep.txt",
        "rw/file.txt",
        "outside/file.txt",
        "lone.txt",
        "sibling.txt",
    ):
        (tmp_path / name).write_text(name)
    return tmp_path


def _restrict(
    tree: Path,
    *,
    read_only: Sequence[str] = (),
    read_write: Sequence[str] = (),
    deny_tcp: bool = False,
    scope: bool = False,
) -> int:
    return landlock.restrict(
        read_only=[*_SYSTEM, str(tree / "ro"), *read_only],
        read_write=[str(tree / "rw"), *read_write],
        deny_tcp=deny_tcp,
        scope=scope,
    )


def test_abi() -> None:
    assert ABI >= 1
    assert landlock.abi() == ABI


def test_files(tree: Path) -> None:
    def attempt() -> dict[str, Any]:
        before = {
            "read outside": outcome(_read(tree / "outside/file.txt")),
            "write read-only": outcome(_write(tree / "ro/file.txt")),
        }
        used = _restrict(tree, read_only=[str(tree / "does-not-exist")])
        return {
            "abi": used,
            "before": before,
            "read outside": outcome(_read(tree / "outside/file.txt")),
            "list outside": outcome(lambda: os.listdir(tree / "outside")),
            "create outside": outcome(_write(tree / "outside/new.txt")),
            "read read-only": outcome(_read(tree / "ro/file.txt")),
            "read read-only, deeper": outcome(_read(tree / "ro/sub/deep.txt")),
            "list read-only": outcome(lambda: os.listdir(tree / "ro")),
            "write read-only": outcome(_write(tree / "ro/file.txt")),
            "create in read-only": outcome(_write(tree / "ro/new.txt")),
            "remove in read-only": outcome(lambda: os.unlink(tree / "ro/file.txt")),
            "write read-write": outcome(_write(tree / "rw/file.txt")),
            "create in read-write": outcome(_write(tree / "rw/new.txt")),
            "mkdir in read-write": outcome(lambda: os.mkdir(tree / "rw/dir")),
            "rename in read-write": outcome(
                lambda: os.rename(tree / "rw/new.txt", tree / "rw/dir/moved.txt")
            ),
            "remove in read-write": outcome(lambda: os.unlink(tree / "rw/dir/moved.txt")),
            "read /etc/passwd": outcome(_read(Path("/etc/passwd"))),
            "run a program": outcome(lambda: subprocess.run(["/usr/bin/true"], check=True)),
        }

    results, _ = in_child(attempt)
    assert results.pop("abi") == ABI
    assert results.pop("before") == {"read outside": "ok", "write read-only": "ok"}, (
        "as root, nothing is denied"
    )
    assert results == {
        "read outside": "EACCES",
        "list outside": "EACCES",
        "create outside": "EACCES",
        "read read-only": "ok",
        "read read-only, deeper": "ok",
        "list read-only": "ok",
        "write read-only": "EACCES",
        "create in read-only": "EACCES",
        "remove in read-only": "EACCES",
        "write read-write": "ok",
        "create in read-write": "ok",
        "mkdir in read-write": "ok",
        # Renames across directories need ABI 2 (LANDLOCK_ACCESS_FS_REFER); ABI 1 denies them.
        "rename in read-write": "ok" if ABI >= 2 else "EXDEV",
        "remove in read-write": "ok" if ABI >= 2 else "ENOENT",
        "read /etc/passwd": "EACCES",
        "run a program": "ok",
    }


def test_rules_on_single_files(tree: Path) -> None:
    """A file as a rule's path: that file only, with the rights that apply to files."""

    def attempt() -> dict[str, str]:
        landlock.restrict(
            read_only=[str(tree / "lone.txt")],
            read_write=[str(tree / "rw/file.txt")],
            deny_tcp=False,
            scope=False,
        )
        return {
            "read the file": outcome(_read(tree / "lone.txt")),
            "write the file": outcome(_write(tree / "lone.txt")),
            "read its sibling": outcome(_read(tree / "sibling.txt")),
            "write the read-write file": outcome(_write(tree / "rw/file.txt")),
            "create next to it": outcome(_write(tree / "rw/other.txt")),
        }

    results, _ = in_child(attempt)
    assert results == {
        "read the file": "ok",
        "write the file": "EACCES",
        "read its sibling": "EACCES",
        "write the read-write file": "ok",
        "create next to it": "EACCES",
    }


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP socket listening on 127.0.0.1 (in the test process, outside any domain)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


def _connect(address: tuple[str, int]) -> Callable[[], object]:
    def connect() -> None:
        with socket.create_connection(address, timeout=5):
            pass

    return connect


def _bind() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))


@pytest.mark.parametrize("deny_tcp", [True, False])
def test_tcp(tree: Path, listener: socket.socket, deny_tcp: bool) -> None:
    if ABI < 4:
        pytest.skip(f"TCP rules need Landlock ABI 4 (this kernel: {ABI})")
    address = listener.getsockname()

    def attempt() -> dict[str, str]:
        before = outcome(_connect(address))
        _restrict(tree, deny_tcp=deny_tcp)
        return {"before": before, "connect": outcome(_connect(address)), "bind": outcome(_bind)}

    results, _ = in_child(attempt)
    denied = "EACCES" if deny_tcp else "ok"
    assert results == {"before": "ok", "connect": denied, "bind": denied}


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process started by the test, before (and outside) any child's domain."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


@pytest.mark.parametrize("scope", [True, False])
def test_signals(tree: Path, sleeper: subprocess.Popen[bytes], scope: bool) -> None:
    if ABI < 6:
        pytest.skip(f"scopes need Landlock ABI 6 (this kernel: {ABI})")

    def attempt() -> dict[str, Any]:
        before = outcome(lambda: os.kill(sleeper.pid, 0))
        _restrict(tree, scope=scope)
        own = os.fork()
        if own == 0:
            time.sleep(60)
            os._exit(0)
        killed_own = outcome(lambda: os.kill(own, signal.SIGKILL))
        _, status = os.waitpid(own, 0)
        return {
            "before": before,
            "kill outside": outcome(lambda: os.kill(sleeper.pid, signal.SIGTERM)),
            "kill own child": [killed_own, os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL],
        }

    results, _ = in_child(attempt)
    assert results["before"] == "ok", "as root, signalling the sleeper works without Landlock"
    assert results["kill own child"] == ["ok", True]
    if scope:
        assert results["kill outside"] == "EPERM"
        assert sleeper.poll() is None, "the sleeper must still be running"
    else:
        assert results["kill outside"] == "ok"


def test_a_scope_only_ruleset_leaves_files_alone(tree: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """``files=False`` (the bwrap backend, whose mounts confine files): every path stays as it
    was, signals out of the domain do not."""
    if ABI < 6:
        pytest.skip(f"scopes need Landlock ABI 6 (this kernel: {ABI})")
    outside = tree / "elsewhere.txt"

    def attempt() -> dict[str, str]:
        ruleset = landlock.Ruleset(deny_tcp=False, scope=True, files=False)
        ruleset.enforce()
        return {
            "write anywhere": outcome(lambda: outside.write_text("x")),
            "read /etc": outcome(
                lambda: Path("/etc/hostname").read_bytes() if Path("/etc/hostname").exists() else b""
            ),
            "kill outside": outcome(lambda: os.kill(sleeper.pid, signal.SIGTERM)),
        }

    results, _ = in_child(attempt)
    assert results == {"write anywhere": "ok", "read /etc": "ok", "kill outside": "EPERM"}
    assert sleeper.poll() is None


def test_a_ruleset_that_handles_nothing_is_refused() -> None:
    """Without ABI 6 a scope-only ruleset would confine nothing: it is refused, not faked."""
    if ABI >= 6:
        pytest.skip("this kernel has scopes")
    with pytest.raises(OSError, match="handles none"):
        landlock.Ruleset(deny_tcp=False, scope=True, files=False)


@pytest.mark.parametrize("scope", [True, False])
def test_abstract_unix_sockets(tree: Path, scope: bool) -> None:
    if ABI < 6:
        pytest.skip(f"scopes need Landlock ABI 6 (this kernel: {ABI})")
    name = f"\0sabre-landlock-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(name)
        server.listen(4)

        def connect() -> None:
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(name)

        def attempt() -> dict[str, str]:
            before = outcome(connect)
            _restrict(tree, scope=scope)
            return {"before": before, "after": outcome(connect)}

        results, _ = in_child(attempt)
    assert results == {"before": "ok", "after": "EPERM" if scope else "ok"}


def test_threads(tree: Path) -> None:
    """A thread that exists at ``restrict`` would escape the domain: with ABI 8 it is restricted
    too (TSYNC); below, ``restrict`` refuses and restricts nothing."""

    def attempt() -> dict[str, Any]:
        go, done = threading.Event(), threading.Event()
        seen: dict[str, str] = {}

        def helper() -> None:
            go.wait(10)
            seen["thread reads outside"] = outcome(_read(tree / "outside/file.txt"))
            done.set()

        threading.Thread(target=helper, daemon=True).start()
        try:
            _restrict(tree)
            refused = ""
        except OSError as exc:
            refused = str(exc)
        go.set()
        done.wait(10)
        return {"refused": refused, **seen, "reads outside": outcome(_read(tree / "outside/file.txt"))}

    results, _ = in_child(attempt)
    if ABI >= 8:
        assert results == {"refused": "", "thread reads outside": "EACCES", "reads outside": "EACCES"}
    else:
        assert "other thread" in results["refused"]
        assert results["thread reads outside"] == results["reads outside"] == "ok"


def test_a_thread_started_after_restrict_is_restricted(tree: Path) -> None:
    def attempt() -> str:
        _restrict(tree)
        seen: list[str] = []
        thread = threading.Thread(target=lambda: seen.append(outcome(_read(tree / "outside/file.txt"))))
        thread.start()
        thread.join()
        return seen[0]

    result, _ = in_child(attempt)
    assert result == "EACCES"


def test_prepared_ruleset(tree: Path) -> None:
    """Paths added while idle, the block's own path and ``enforce`` later: the same domain."""

    def attempt() -> dict[str, str]:
        ruleset = landlock.Ruleset(deny_tcp=True, scope=True)
        ruleset.allow(read_only=[*_SYSTEM, str(tree / "ro")])
        ruleset.warm()
        ruleset.allow(read_write=[str(tree / "rw")])
        ruleset.enforce()
        return {
            "read read-only": outcome(_read(tree / "ro/file.txt")),
            "write read-write": outcome(_write(tree / "rw/file.txt")),
            "read outside": outcome(_read(tree / "outside/file.txt")),
            "enforce again": outcome(ruleset.enforce),
        }

    results, _ = in_child(attempt)
    assert results == {
        "read read-only": "ok",
        "write read-write": "ok",
        "read outside": "EACCES",
        "enforce again": "EBADF",
    }


def test_no_new_privs_is_set_and_proc_needs_a_rule(tree: Path) -> None:
    def attempt(read_only: Sequence[str]) -> str:
        _restrict(tree, read_only=read_only)
        try:
            with open("/proc/self/status") as status:
                return next(line for line in status if line.startswith("NoNewPrivs"))
        except OSError as exc:
            return errno.errorcode[exc.errno or 0]

    without_proc, _ = in_child(lambda: attempt([]))
    with_proc, _ = in_child(lambda: attempt(["/proc"]))
    assert without_proc == "EACCES"
    assert with_proc.split() == ["NoNewPrivs:", "1"]


def _restrict_times(tree: Path, *, prepared: bool, children: int) -> Iterator[float]:
    read_only = [*_SYSTEM, str(tree / "ro"), "/proc", "/etc/ssl"]
    read_write = str(tree / "rw")
    for _ in range(children):

        def attempt() -> int:
            if not prepared:
                start = time.perf_counter_ns()
                landlock.restrict(read_only=read_only, read_write=[read_write], deny_tcp=True, scope=True)
                return time.perf_counter_ns() - start
            ruleset = landlock.Ruleset(deny_tcp=True, scope=True)
            ruleset.allow(read_only=read_only, read_write=["/dev/null"])
            ruleset.warm()
            start = time.perf_counter_ns()
            ruleset.allow(read_write=[read_write])
            ruleset.enforce()
            return time.perf_counter_ns() - start

        elapsed, _ = in_child(attempt)
        yield elapsed / 1000


def test_restrict_is_cheap(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_call = statistics.median(_restrict_times(tree, prepared=False, children=21))
    prepared = statistics.median(_restrict_times(tree, prepared=True, children=21))
    with capsys.disabled():
        print(
            f"\nlandlock per child: restrict() with 11 paths median {one_call:.0f} us (cold); "
            f"prepared while idle, the block's path + enforce() median {prepared:.0f} us"
        )
    assert prepared < 2000
