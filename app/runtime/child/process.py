"""What the child does to its own process: the block's rlimits, death with its parent, reaping
what its last block started, counting its threads, holding signals between live blocks."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import math
import os
import resource
import signal
import threading
from collections.abc import Mapping
from typing import Any, Final

from app.runtime import isolation
from app.runtime.protocol import (
    LIVE_MAX_BLOCKS,
)

_PR_SET_PDEATHSIG: Final = 1
_SIG_BLOCK: Final = 0
_SIG_SETMASK: Final = 2
_SIGSET_BYTES: Final = 128  # glibc's sigset_t
_LIBC: Final = ctypes.CDLL(None, use_errno=True)


def hold_signals() -> bytes:
    """Block every signal that can be blocked (glibc keeps its own two out); the mask before, to
    give back to ``restore_signals``. Through libc: ``signal.pthread_sigmask`` builds a set of
    enum members of every signal both ways, 0.13 ms against 1 us, which a live process's next
    block (0.6 ms in all) would pay."""
    every = ctypes.create_string_buffer(b"\xff" * _SIGSET_BYTES, _SIGSET_BYTES)
    before = ctypes.create_string_buffer(_SIGSET_BYTES)
    if _LIBC.pthread_sigmask(_SIG_BLOCK, every, before) != 0:
        raise OSError(ctypes.get_errno(), "pthread_sigmask")
    return before.raw


def restore_signals(mask: bytes, *, drop: tuple[int, ...] = ()) -> None:
    """Set the signal mask ``hold_signals`` returned: what was held is delivered now, but for
    the signals in ``drop``, taken off first (pending ones are consumed, not delivered)."""
    if drop:
        dropped = bytearray(_SIGSET_BYTES)
        for signum in drop:
            dropped[(signum - 1) // 8] |= 1 << ((signum - 1) % 8)
        wanted, now = ctypes.create_string_buffer(bytes(dropped), _SIGSET_BYTES), _Timespec(0, 0)
        while _LIBC.sigtimedwait(wanted, None, ctypes.byref(now)) > 0:
            pass
    if _LIBC.pthread_sigmask(_SIG_SETMASK, ctypes.create_string_buffer(mask, _SIGSET_BYTES), None) != 0:
        raise OSError(ctypes.get_errno(), "pthread_sigmask")


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


_LIMITED: Final = (
    resource.RLIMIT_CORE,
    resource.RLIMIT_CPU,
    resource.RLIMIT_AS,
    resource.RLIMIT_NPROC,
    resource.RLIMIT_FSIZE,
    resource.RLIMIT_NOFILE,
)
# The worker's limits, read once (every child starts with the same).
_WORKER_LIMITS: Final = {which: resource.getrlimit(which) for which in _LIMITED}


def _set_limit(which: int, soft: int, hard: int | None = None) -> None:
    """Lower a resource limit, never above the hard limit the worker already had."""
    current_hard = _WORKER_LIMITS[which][1]
    hard = soft if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(which, (soft, hard))


def apply_limits(
    limits: Mapping[str, Any], *, dry: bool = False, keep: bool = False, live: bool = False
) -> None:
    """Apply the block's rlimits to this process (inherited by anything it starts).

    ``dry`` makes the same calls with the current values: the warm-up uses it. ``keep``: the
    process may stay live for later blocks of its conversation, so the hard CPU limit leaves
    room for ``LIVE_MAX_BLOCKS`` of them (the worker enforces each block's own CPU time);
    ``live``: a later block of a live process, whose hard limit was set by its first block.
    """
    wanted: list[tuple[int, int, int | None]] = [(resource.RLIMIT_CORE, 0, None)]
    # RLIMIT_CPU counts from process start: add what the fork has used already. SIGXCPU comes
    # at the soft limit, SIGKILL a second later if the code ignores it.
    used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    budget = float(limits["cpu_seconds"])
    cpu = math.ceil(used + budget)
    if live:
        cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        if cpu_hard != resource.RLIM_INFINITY and cpu >= cpu_hard:
            raise OSError(errno.EAGAIN, "this live process has no CPU time left for another block")
        wanted.append((resource.RLIMIT_CPU, cpu, cpu_hard))
    elif keep:
        wanted.append((resource.RLIMIT_CPU, cpu, cpu + math.ceil(budget + 1) * (LIVE_MAX_BLOCKS + 1) + 1))
    else:
        wanted.append((resource.RLIMIT_CPU, cpu, cpu + 1))
    # bwrap: /tmp and /dev/shm are memory too, and count against the same limit.
    memory = (int(limits["memory_mb"]) << 20) - isolation.tmpfs_bytes(limits)
    wanted.append((resource.RLIMIT_AS, memory, None))
    wanted.append((resource.RLIMIT_NPROC, int(limits["max_processes"]), None))
    wanted.append((resource.RLIMIT_FSIZE, int(limits["file_size_mb"]) << 20, None))
    wanted.append((resource.RLIMIT_NOFILE, int(limits["open_files"]), None))
    for which, soft, hard in wanted:
        if dry:
            soft, hard = _WORKER_LIMITS[which]
        _set_limit(which, soft, hard)


# Looked up once in the worker, not in every child.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (no orphans left running)."""
    parent = os.getppid()
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def reap_children() -> None:
    """Reap the exited children of this process (a live one: its last block's, killed)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def thread_count() -> int:
    """The threads of this process, as the kernel counts them (native ones included): procfs
    gives its task directory a link per thread beyond its own two, a stat where listing the
    directory costs several times as much (twice per block of a live process)."""
    try:
        return os.stat("/proc/self/task").st_nlink - 2
    except OSError:
        return threading.active_count()
