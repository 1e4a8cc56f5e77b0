"""The sandbox's seccomp filter (``app.runtime.seccomp``), installed in forked children.

Each test forks the test process, installs the filter in the child, tries things there and
reports through a pipe; the parent asserts. Denied calls are made through ``syscall(2)`` with
harmless arguments, and the same calls made without the filter must not fail with EPERM (so
the EPERM comes from the filter, even as root).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import multiprocessing
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.runtime import seccomp
from tests.runtime.support import in_child

pytestmark = pytest.mark.skipif(
    (why := seccomp.available()) is not None, reason=f"seccomp filters unavailable: {why}"
)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_NULL = ctypes.c_void_p(None)
_MISSING = ctypes.c_char_p(b"/nonexistent-sabre/x")
_AF_UNIX = 1
_AF_INET = 2
_CLONE_NAMESPACES = {
    "CLONE_NEWTIME": 0x80,
    "CLONE_NEWNS": 0x20000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}


def _nr(name: str) -> int:
    import pyseccomp

    number = int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name))
    return number if number >= 0 else {"open_tree_attr": 467}[name]


def _sys(name: str, *args: Any) -> tuple[int, int]:
    """``syscall(name, *args)``: (result, errno when it failed else 0)."""
    converted = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = _libc.syscall(ctypes.c_long(_nr(name)), *converted)
    return int(result), (ctypes.get_errno() if result == -1 else 0)


# Harmless arguments: without the filter each call fails with something other than EPERM (or
# succeeds without effect), even as root.
_DENIED_CALLS: dict[str, tuple[Any, ...]] = {
    "ptrace": (16, 0x3FFFFFFF, 0, 0),  # PTRACE_ATTACH to no process
    "process_vm_readv": (os.getpid(), _NULL, 0, _NULL, 0, 0),
    "process_vm_writev": (os.getpid(), _NULL, 0, _NULL, 0, 0),
    "pidfd_getfd": (-1, 0, 0),
    "mount": (_NULL, _NULL, _NULL, 0, _NULL),
    "umount2": (_MISSING, 0),
    "pivot_root": (_NULL, _NULL),
    "chroot": (_MISSING,),
    "unshare": (0,),
    "setns": (-1, 0),
    "fsopen": (_NULL, 0),
    "fsconfig": (-1, 0, _NULL, _NULL, 0),
    "fsmount": (-1, 0, 0),
    "fspick": (-1, _NULL, 0xFFFF0000),
    "move_mount": (-1, _NULL, -1, _NULL, 0xFFFF0000),
    "open_tree": (-1, _NULL, 0xFFFF0000),
    "open_tree_attr": (-1, _NULL, 0xFFFF0000, _NULL, 0),
    "mount_setattr": (-1, _NULL, 0xFFFF0000, _NULL, 0),
    "bpf": (-1, _NULL, 0),
    "perf_event_open": (_NULL, 0, -1, -1, 0),
    "keyctl": (0xFFFF, 0, 0, 0, 0),
    "add_key": (_NULL, _NULL, _NULL, 0, 0),
    "request_key": (_NULL, _NULL, _NULL, 0),
    "userfaultfd": (0xFFFF,),
    "io_uring_setup": (0, _NULL),
    "io_uring_enter": (-1, 0, 0, 0, _NULL, 0),
    "io_uring_register": (-1, 0, _NULL, 0),
    "open_by_handle_at": (-1, _NULL, 0),
    "name_to_handle_at": (-1, _NULL, _NULL, _NULL, 0),
    "fanotify_init": (0xFFFFFFFF, 0),
    "lookup_dcookie": (0, _NULL, 0),
    "kexec_load": (0, 0, _NULL, 0xFFFF0000),
    "kexec_file_load": (-1, -1, 0, _NULL, 0xFFFF0000),
    "init_module": (_NULL, 0, _NULL),
    "finit_module": (-1, _NULL, 0),
    "delete_module": (ctypes.c_char_p(b"sabre_nonexistent"), os.O_NONBLOCK),
    "swapon": (_MISSING, 0),
    "swapoff": (_MISSING,),
    "reboot": (0, 0, 0, _NULL),
    "acct": (_MISSING,),
    "quotactl": (0, _NULL, 0, _NULL),
    "quotactl_fd": (-1, 0, 0, _NULL),
    "syslog": (-1, _NULL, 0),
    "personality": (0x0040000,),  # ADDR_NO_RANDOMIZE
}


@pytest.fixture(scope="module")
def closed() -> seccomp.Filter:
    """No network, no AF_UNIX sockets: the strictest filter."""
    return seccomp.build(network=False, unix_sockets=False)


def test_available() -> None:
    assert seccomp.available() is None


def test_built_once_installed_from_the_raw_program(closed: seccomp.Filter) -> None:
    assert 0 < closed.instructions <= 4096
    assert len(closed.program) == 8 * closed.instructions
    # The program starts with the architecture check: load seccomp_data.arch (offset 4).
    code, _, _, k = struct.unpack_from("=HBBI", closed.program)
    assert (code, k) == (0x20, 4)


def test_denied_system_calls_fail_with_eperm(closed: seccomp.Filter) -> None:
    def attempt(install: bool) -> dict[str, list[int]]:
        if install:
            closed.install()
        return {name: list(_sys(name, *args)) for name, args in _DENIED_CALLS.items()}

    unfiltered, _ = in_child(lambda: attempt(False))
    filtered, status = in_child(lambda: attempt(True))
    assert os.waitstatus_to_exitcode(status) == 0
    for name in _DENIED_CALLS:
        assert filtered[name] == [-1, errno.EPERM], name
        assert unfiltered[name][1] != errno.EPERM, f"{name} fails with EPERM even without the filter"


def test_mount_is_closed_by_the_second_stage(closed: seccomp.Filter) -> None:
    """A child installs the filter while idle with mount(2) left open (it still mounts its
    block's directory), then the closer when its block comes: together they deny all the whole
    filter denies; before the closer, only mount gets through."""
    staged = seccomp.build(network=False, unix_sockets=False, mount=True)
    closer = seccomp.mount_closer()
    assert (staged.mount, closed.mount) == (True, False)
    assert closer.instructions < staged.instructions // 4

    def attempt(stages: tuple[seccomp.Filter, ...]) -> dict[str, list[int]]:
        for stage in stages:
            stage.install()
        return {name: list(_sys(name, *args)) for name, args in _DENIED_CALLS.items()}

    idle, _ = in_child(lambda: attempt((staged,)))
    both, status = in_child(lambda: attempt((staged, closer)))
    alone, _ = in_child(lambda: attempt((closer,)))
    assert os.waitstatus_to_exitcode(status) == 0
    assert both == {name: [-1, errno.EPERM] for name in _DENIED_CALLS}
    assert idle.pop("mount")[1] != errno.EPERM
    assert idle == {name: [-1, errno.EPERM] for name in idle}
    assert alone.pop("mount") == [-1, errno.EPERM]
    assert all(result[1] != errno.EPERM for result in alone.values())


def test_namespaces_tracing_and_clone3(closed: seccomp.Filter) -> None:
    def attempt() -> dict[str, list[int]]:
        closed.install()
        results = {
            "unshare(CLONE_NEWUSER)": list(_sys("unshare", _CLONE_NAMESPACES["CLONE_NEWUSER"])),
            "ptrace(PTRACE_TRACEME)": list(_sys("ptrace", 0, 0, 0, 0)),
            "clone3": list(_sys("clone3", _NULL, 0)),
            "personality(query)": [_sys("personality", 0xFFFFFFFF)[1]],
            "personality(PER_LINUX)": list(_sys("personality", 0)),
        }
        for name, flag in _CLONE_NAMESPACES.items():
            result = _sys("clone", flag | signal.SIGCHLD, 0, 0, 0, 0)
            if result[0] == 0:  # the filter let it through: this is the new child
                os._exit(0)
            results[f"clone({name})"] = list(result)
        return results

    results, _ = in_child(attempt)
    assert results.pop("clone3") == [-1, errno.ENOSYS]
    assert results.pop("personality(query)") == [0]
    assert results == {name: [-1, errno.EPERM] for name in results}


def test_terminal_injection_ioctls(closed: seccomp.Filter) -> None:
    tiocsti, tioclinux, fionread = 0x5412, 0x541C, 0x541B

    def attempt() -> dict[str, int]:
        read_fd, _ = os.pipe()
        closed.install()
        char = ctypes.c_char(b"x")
        count = ctypes.c_int()
        return {
            "TIOCSTI": _sys("ioctl", read_fd, tiocsti, ctypes.byref(char))[1],
            # The kernel reads the request as 32 bits: upper bits must not get past the rule.
            "TIOCSTI | 1 << 32": _sys("ioctl", read_fd, tiocsti | 1 << 32, ctypes.byref(char))[1],
            "TIOCLINUX": _sys("ioctl", read_fd, tioclinux, ctypes.byref(char))[1],
            "FIONREAD": _sys("ioctl", read_fd, fionread, ctypes.byref(count))[1],
        }

    results, _ = in_child(attempt)
    assert results == {
        "TIOCSTI": errno.EPERM,
        "TIOCSTI | 1 << 32": errno.EPERM,
        "TIOCLINUX": errno.EPERM,
        "FIONREAD": 0,
    }


def _socket_errors() -> dict[str, int]:
    """What socket creation gives in this process: 0 or the errno, per attempt."""

    def attempt(family: int, kind: int = socket.SOCK_STREAM) -> int:
        result, code = _sys("socket", family, kind, 0)
        if result >= 0:
            os.close(result)
        return code

    pair = 0
    try:
        left, right = socket.socketpair(socket.AF_UNIX)
        left.close()
        right.close()
    except OSError as exc:
        pair = exc.errno or -1
    return {
        "AF_INET": attempt(_AF_INET),
        "AF_INET6": attempt(socket.AF_INET6),
        "AF_NETLINK": attempt(socket.AF_NETLINK, socket.SOCK_RAW),
        "AF_INET | 1 << 32": attempt(_AF_INET | 1 << 32),
        "AF_UNIX": attempt(_AF_UNIX),
        "AF_UNIX | 1 << 32": attempt(_AF_UNIX | 1 << 32),
        "socketpair(AF_UNIX)": pair,
    }


@pytest.mark.parametrize(
    ("network", "unix_sockets"), [(False, False), (False, True), (True, False), (True, True)]
)
def test_sockets(network: bool, unix_sockets: bool) -> None:
    built = seccomp.build(network=network, unix_sockets=unix_sockets)

    def attempt() -> dict[str, int]:
        built.install()
        return _socket_errors()

    results, _ = in_child(attempt)
    inet = 0 if network else errno.EAFNOSUPPORT
    assert results["AF_INET"] == inet
    assert results["AF_INET6"] in (inet, errno.EAFNOSUPPORT)  # a kernel may lack IPv6
    assert results["AF_NETLINK"] == inet
    assert results["AF_INET | 1 << 32"] == inet
    assert results["AF_UNIX"] == (0 if unix_sockets else errno.EPERM)
    # Upper bits never reach AF_UNIX past a rule: the kernel would read the family as AF_UNIX.
    if not unix_sockets:
        assert results["AF_UNIX | 1 << 32"] in (errno.EPERM, errno.EAFNOSUPPORT)
    assert results["socketpair(AF_UNIX)"] == 0


def test_a_thread_started_before_install_is_filtered(closed: seccomp.Filter) -> None:
    def attempt() -> dict[str, int]:
        go, done = threading.Event(), threading.Event()
        seen: dict[str, int] = {}

        def helper() -> None:
            go.wait()
            seen["unshare"] = _sys("unshare", 0)[1]
            seen["socket(AF_INET)"] = _sys("socket", _AF_INET, socket.SOCK_STREAM, 0)[1]
            seen["no_new_privs"] = _libc.prctl(39, 0, 0, 0, 0)
            done.set()

        thread = threading.Thread(target=helper, daemon=True)
        thread.start()
        closed.install()
        go.set()
        done.wait(10)
        return seen

    seen, _ = in_child(attempt)
    assert seen == {"unshare": errno.EPERM, "socket(AF_INET)": errno.EAFNOSUPPORT, "no_new_privs": 1}


def test_install_raises_when_a_thread_cannot_be_synchronised(closed: seccomp.Filter) -> None:
    """TSYNC fails when another thread has a filter of its own: install must not go on silently."""
    allow = seccomp.Filter(struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000), network=True, unix_sockets=True)
    program = ctypes.create_string_buffer(allow.program, len(allow.program))

    class Fprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    def attempt() -> str:
        ready, stop = threading.Event(), threading.Event()

        def own_filter() -> None:  # this thread only (no TSYNC)
            _libc.prctl(38, 1, 0, 0, 0)
            fprog = Fprog(1, ctypes.addressof(program))
            _sys("seccomp", 1, 0, ctypes.byref(fprog))
            ready.set()
            stop.wait(10)

        threading.Thread(target=own_filter, daemon=True).start()
        ready.wait(10)
        try:
            closed.install()
        except OSError as exc:
            return str(exc)
        finally:
            stop.set()
        return "installed"

    message, _ = in_child(attempt)
    assert "TSYNC" in message
    assert "thread" in message


def test_python_still_works(closed: seccomp.Filter) -> None:
    """fork, threads (clone3 -> ENOSYS -> clone), subprocess, multiprocessing (fork context, a
    duplex Pipe: a socketpair) and a fresh interpreter importing numpy (which starts its BLAS
    threads) all work under the strictest filter."""
    code = (
        "import numpy, threading\n"
        "t = threading.Thread(target=print)\nt.start()\nt.join()\n"
        "print(int(numpy.arange(10).sum()))\n"
    )

    def attempt() -> dict[str, Any]:
        numpy_imported = "numpy" in sys.modules
        closed.install()
        results: dict[str, Any] = {"true": subprocess.run(["true"], check=False).returncode}
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        results["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        box: list[int] = []
        thread = threading.Thread(target=lambda: box.append(1))
        thread.start()
        thread.join()
        results["thread"] = box
        context = multiprocessing.get_context("fork")
        here, there = context.Pipe(duplex=True)
        process = context.Process(target=there.send, args=("pong",))
        process.start()
        received = here.recv()
        process.join(10)
        results["multiprocessing"] = [received, process.exitcode]
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        results["numpy subprocess"] = [run.returncode, run.stdout, run.stderr[-2000:]]
        import numpy

        results["numpy here"] = [int(numpy.arange(4).sum()), not numpy_imported]
        return results

    results, _ = in_child(attempt)
    assert results["true"] == 0
    assert results["fork"] == 7
    assert results["thread"] == [1]
    assert results["multiprocessing"] == ["pong", 0]
    assert results["numpy subprocess"][:2] == [0, "\n45\n"], results["numpy subprocess"][2]
    assert results["numpy here"][0] == 6


def test_a_filtered_program_keeps_the_filter(closed: seccomp.Filter) -> None:
    """The filter survives exec: a new program is as confined as the child."""

    def attempt() -> list[Any]:
        closed.install()
        probe = "import socket\ntry:\n    socket.socket()\nexcept OSError as e:\n    print(e.errno)\n"
        run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
        return [run.returncode, run.stdout.strip()]

    result, _ = in_child(attempt)
    assert result == [0, str(errno.EAFNOSUPPORT)]


def _x86_64_only() -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the foreign-ABI probes are x86_64 machine code")


def test_x32_system_calls_kill_the_process(closed: seccomp.Filter) -> None:
    _x86_64_only()

    def attempt() -> int:
        closed.install()
        _libc.syscall(ctypes.c_long(0x40000000 | 39))  # x32 getpid
        return 0

    result, status = in_child(attempt)
    assert result is None
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGSYS


def _int80_getpid() -> int:
    """getpid through the i386 entry point (int 0x80, eax = 20)."""
    code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])  # mov eax, 20; int 0x80; ret
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    function = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    return int(function())


def test_i386_system_calls_kill_the_process(closed: seccomp.Filter) -> None:
    _x86_64_only()
    unfiltered, status = in_child(lambda: _int80_getpid() > 0)
    if unfiltered is not True:
        pytest.skip(f"this kernel has no i386 entry point (wait status {status})")

    def attempt() -> int:
        closed.install()
        return _int80_getpid()

    result, status = in_child(attempt)
    assert result is None
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGSYS


def _install_times(built: seccomp.Filter, *, warm: bool, children: int) -> Iterator[float]:
    for _ in range(children):

        def attempt() -> int:
            threading.Thread(target=threading.Event().wait, args=(5,), daemon=True).start()
            if warm:
                built.warm()
            start = time.perf_counter_ns()
            built.install()
            return time.perf_counter_ns() - start

        elapsed, _ = in_child(attempt)
        yield elapsed / 1000


def test_install_is_cheap(closed: seccomp.Filter, capsys: pytest.CaptureFixture[str]) -> None:
    """Installing the compiled program costs microseconds, not libseccomp's milliseconds."""
    cold = statistics.median(_install_times(closed, warm=False, children=21))
    warm = statistics.median(_install_times(closed, warm=True, children=21))
    with capsys.disabled():
        print(f"\nseccomp install per child: median {cold:.0f} us cold, {warm:.0f} us after warm()")
    assert warm < 2000


def test_inotify_is_absent(closed: seccomp.Filter, tmp_path: Path) -> None:
    """inotify watches paths past Landlock, onto files every block shares (what another
    conversation imports; the server's /tmp under the process backend): ENOSYS, as if absent."""
    watched = str(tmp_path).encode()

    def attempt(install: bool) -> dict[str, list[int]]:
        if install:
            closed.install()
        fd, err = _sys("inotify_init1", 0)
        return {
            "inotify_init1": [min(fd, 0), err if fd < 0 else 0],
            "inotify_add_watch": list(_sys("inotify_add_watch", fd, ctypes.c_char_p(watched), 0x100)),
        }

    unfiltered, _ = in_child(lambda: attempt(False))
    filtered, _ = in_child(lambda: attempt(True))
    assert unfiltered["inotify_init1"] == [0, 0]
    assert unfiltered["inotify_add_watch"][0] >= 1
    assert filtered == {"inotify_init1": [-1, errno.ENOSYS], "inotify_add_watch": [-1, errno.ENOSYS]}
