"""The Linux calls the sandbox is made of (mounts, prctl, capabilities, process trees), through
libc: the same on the server's side and in the sandbox. Standard library only."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import Final

# Linux constants (uapi; the same on every architecture this runs on).
CLONE_NEWNS: Final = 0x00020000
CLONE_NEWIPC: Final = 0x08000000
CLONE_NEWNET: Final = 0x40000000
CLONE_NEWUSER: Final = 0x10000000
MS_RDONLY: Final = 1
MS_NOSUID: Final = 2
MS_NODEV: Final = 4
MS_NOEXEC: Final = 8
MS_REMOUNT: Final = 32
MS_BIND: Final = 4096
MS_REC: Final = 16384
MS_PRIVATE: Final = 1 << 18
PR_SET_PDEATHSIG: Final = 1
PR_SET_DUMPABLE: Final = 4
PR_CAPBSET_DROP: Final = 24
PR_SET_NO_NEW_PRIVS: Final = 38
CAPABILITY_VERSION_3: Final = 0x20080522


class CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


NO_CAPS_HEADER = CapHeader(CAPABILITY_VERSION_3, 0)
NO_CAPS = (CapData * 2)()  # all zero
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
libc.unshare.argtypes = (ctypes.c_int,)
libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
libc.capset.argtypes = (ctypes.POINTER(CapHeader), ctypes.POINTER(CapData))


def check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = libc.mount(
        None if source is None else os.fsencode(source),
        os.fsencode(target),
        None if fstype is None else fstype.encode(),
        flags,
        None if data is None else data.encode(),
    )
    check(result, f"mount {target}")


def prctl(option: int, arg: int = 0) -> None:
    check(libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


def write_file(path: str | os.PathLike[str], text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def drop_capabilities() -> None:
    """Clear the effective, permitted and inheritable capabilities of the calling thread.

    Capabilities belong to threads: every thread that exists when a block starts must call this
    (or have been created after its creator did).
    """
    NO_CAPS_HEADER.version, NO_CAPS_HEADER.pid = CAPABILITY_VERSION_3, 0
    check(libc.capset(ctypes.byref(NO_CAPS_HEADER), NO_CAPS), "capset")


def set_dumpable(dumpable: bool) -> None:
    """Mark this process (non-)dumpable: a non-dumpable process's /proc files (environ, mem, fd)
    belong to root, so processes of the same user cannot read them."""
    prctl(PR_SET_DUMPABLE, int(dumpable))


def drop_bounding_set() -> None:
    """Empty the capability bounding set, so no program the code runs can gain a capability."""
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if ctypes.get_errno() != errno.EINVAL:  # EINVAL: past the last capability this kernel has
        raise OSError(ctypes.get_errno(), "cannot drop the capability bounding set")


def capability_sets() -> dict[str, int]:
    """This thread's capability sets from /proc (``CapEff``, ``CapPrm``, ``CapBnd``, ...)."""
    sets: dict[str, int] = {}
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as status:
        for line in status:
            if line.startswith("Cap"):
                name, _, value = line.partition(":")
                sets[name] = int(value.strip(), 16)
    return sets


def children(pid: int) -> list[int]:
    """Pids of the children of ``pid``'s main thread (zombies included): while ``pid`` is not
    reaped, they cannot be reused by another process."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(c) for c in listing.read().split()]
    except (OSError, ValueError):
        return []


def kill_tree(
    root: int, *, wait_seconds: float = 0.0, read_children: Callable[[], list[int]] | None = None
) -> None:
    """SIGKILL every descendant of ``root`` (not ``root`` itself): stopped first, walk after walk,
    until no new one appears, so none can fork away while the tree is taken down. For a process
    worker the server gives up on: the daemons its blocks left are re-parented to it (their
    subreaper) and would otherwise pass to init when it dies. ``wait_seconds``: also wait (at
    most that long) until each has exited, so its parent finds it ready to reap.
    ``read_children``: how to list ``root``'s own children, when the caller can where a fresh open
    of its /proc directory cannot (a descriptor opened earlier: /proc hides a non-dumpable
    process from a new open under ``hidepid``)."""
    stopped: list[int] = []
    seen: set[int] = set()
    for _ in range(1000):
        found = [pid for pid in _descendants(root, read_children) if pid not in seen]
        if not found:
            break
        for pid in found:
            seen.add(pid)
            stopped.append(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
    exits: list[int] = []
    for pid in stopped:
        with contextlib.suppress(OSError):
            exits.append(os.pidfd_open(pid))  # before the kill: the pid cannot be reused under it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    _await_exits(exits, timeout=wait_seconds)


def _await_exits(pidfds: list[int], *, timeout: float) -> None:
    """Wait until each process behind ``pidfds`` has exited (a pidfd reads ready then: a
    zombie or gone), for at most ``timeout`` seconds in all; close the descriptors."""
    try:
        poller = select.poll()
        for fd in pidfds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        waiting = len(pidfds)
        while waiting and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                waiting -= 1
    finally:
        for fd in pidfds:
            os.close(fd)


def _descendants(root: int, read_children: Callable[[], list[int]] | None = None) -> list[int]:
    found: list[int] = []
    stack = [root]
    while stack:
        pid = stack.pop()
        for child in read_children() if pid == root and read_children is not None else children(pid):
            found.append(child)
            stack.append(child)
    return found


def namespace_pids(pid: int) -> list[int]:
    """``pid``'s pids from this process's PID namespace down to its own (``NSpid``); [] if gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return [int(p) for p in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def host_pid(ancestor: int, inner_pid: int, *, nested: bool, depth: int = 4) -> int | None:
    """The pid here of the descendant of ``ancestor`` whose pid in its own PID namespace is
    ``inner_pid``: one PID namespace below this one (``nested``: a bwrap zygote's worker), or in
    this one. None when there is none."""
    levels = len(namespace_pids(os.getpid())) + (1 if nested else 0)
    layer = [ancestor]
    for _ in range(depth):
        layer = [child for parent in layer for child in children(parent)]
        for pid in layer:
            pids = namespace_pids(pid)
            if len(pids) == levels and pids[-1] == inner_pid:
                return pid
    return None
