"""The sandbox's seccomp filter: system calls a block has no business making fail with an errno.

``build`` compiles the filter once, in the worker (libseccomp's compilation costs milliseconds),
into a raw BPF program; ``Filter.install`` hands that program to the kernel in each forked child
with one ``seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC)`` call, for every thread of
the child at once: the child already runs a helper thread when it installs the filter, and a
thread left unfiltered would be a way around it. The kernel still checks, JIT-compiles and
caches the program at each install (about 0.1 ms for this one), so a child installs it while it
waits for its block; a bwrap child, which still mounts its block's directory then, installs it
with mount(2) left open and closes that with ``mount_closer`` (a few instructions) before any
code of the block runs. ``Filter.warm`` keeps the first-call costs of ctypes after a fork off
the block's path.

What it denies (everything else is allowed):

* with EPERM: debugging and reading other processes (ptrace, process_vm_readv/writev,
  pidfd_getfd), mounts and namespaces (mount, umount2, pivot_root, chroot, unshare, setns, the
  new mount API), kernel attack surface a block never needs (bpf, perf_event_open, keyrings,
  userfaultfd, io_uring, file handles, fanotify), administration (modules, kexec, swap, reboot,
  acct, quotas, syslog), ``personality`` other than the query, and ``ioctl`` TIOCSTI/TIOCLINUX
  (typing into a terminal);
* with EPERM, unless aimed at the calling process itself (pid 0): what changes or reads another
  process's scheduling and limits by its pid (``SELF_ONLY``: nice value, I/O priority, CPU
  affinity, scheduling policy, resource limits), which only the same-user check guards and blocks
  of other conversations (workers of one zygote share a PID namespace), or the server under the
  process backend, would pass;
* inotify (ENOSYS, as if absent): it watches paths past Landlock, onto files every block shares;
* ``clone`` with a namespace flag (EPERM), and ``clone3`` altogether with ENOSYS: a filter
  cannot see clone3's flags (they are in memory), and on ENOSYS glibc falls back to ``clone``;
* without ``network``: ``socket`` of any family but AF_UNIX (EAFNOSUPPORT); without
  ``unix_sockets``: ``socket(AF_UNIX)`` too (EPERM). ``socketpair`` stays allowed (Python's
  multiprocessing and subprocess use it);
* without ``ipc``: SysV shared memory, message queues and semaphores and POSIX message queues
  (ENOSYS, as in a kernel built without them). Their objects live in the IPC namespace, not in a
  process: in the host's (the process backend) a segment outlives the block that made it, stays
  charged to its worker's cgroup (the next conversation's block there runs out of memory) and,
  once that worker is retired, to no cgroup that bounds anything; in a block's own (bwrap) it
  goes with the namespace, which the kernel frees only some time after the block's end.

Only the native ABI is allowed: a system call of another one (i386's ``int 0x80`` and x32 on
x86_64, AArch32 on aarch64) kills the process, so 32-bit entry points are no way around the
rules. Arguments the kernel reads as 32-bit ``int``s (socket's family, ioctl's request) are
compared so that set upper bits cannot slip past a rule.

Imported by the sandbox worker: standard library only (libseccomp's ``pyseccomp`` is imported
by ``build`` and ``available``, never by a child).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import tempfile
from collections.abc import Iterator
from typing import Any, Final

# seccomp(2)'s own number, per architecture this runs on.
_NR_SECCOMP: Final[dict[str, int]] = {"x86_64": 317, "aarch64": 277}
_PR_SET_NO_NEW_PRIVS: Final = 38
_PR_GET_SECCOMP: Final = 21
_PR_GET_NO_NEW_PRIVS: Final = 39
_SECCOMP_SET_MODE_FILTER: Final = 1
_SECCOMP_FILTER_FLAG_TSYNC: Final = 1
_MODE_FILTER: Final = ctypes.c_long(_SECCOMP_SET_MODE_FILTER)
_FLAG_TSYNC: Final = ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC)
_BPF_MAXINSNS: Final = 4096
_SOCK_FILTER_SIZE: Final = 8  # struct sock_filter: u16 code, u8 jt, u8 jf, u32 k

_AF_UNIX: Final = 1
_TIOCSTI: Final = 0x5412
_TIOCLINUX: Final = 0x541C
_PERSONALITY_QUERY: Final = 0xFFFFFFFF
_LOW32: Final = 0xFFFFFFFF
# Every namespace flag clone(2) knows. CLONE_NEWTIME (0x80) is only honoured by clone3 and
# unshare (in clone's flags that bit belongs to the exit signal, where no valid signal sets it),
# so its rule is belt and braces.
_CLONE_NAMESPACES: Final = (
    0x00000080,  # CLONE_NEWTIME
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)

# Denied with EPERM, whatever their arguments.
DENIED: Final = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "mount_setattr",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
    "lookup_dcookie",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
)
# System calls that change (or read) another process's scheduling and limits by its pid, which
# neither Landlock (it guards signals and ptrace, not these) nor the kernel's same-user check
# keeps a block from: blocks of other conversations run as the same user beside it (workers of
# one zygote share its PID namespace), and under the process backend so may the server. A block
# may aim them at itself only: (name, the argument that is the pid) and, for those that also
# take a kind of target, the one kind allowed (PRIO_PROCESS, IOPRIO_WHO_PROCESS) as (name,
# argument, value).
SELF_ONLY: Final = (
    ("setpriority", 1),
    ("getpriority", 1),
    ("ioprio_set", 1),
    ("ioprio_get", 1),
    ("sched_setaffinity", 0),
    ("sched_getaffinity", 0),
    ("sched_setscheduler", 0),
    ("sched_getscheduler", 0),
    ("sched_setparam", 0),
    ("sched_getparam", 0),
    ("sched_setattr", 0),
    ("sched_getattr", 0),
    ("sched_rr_get_interval", 0),
    ("prlimit64", 0),
)
_TARGET_KINDS: Final = (
    ("setpriority", 0, 0),
    ("getpriority", 0, 0),
    ("ioprio_set", 0, 1),
    ("ioprio_get", 0, 1),
)
INOTIFY: Final = ("inotify_init", "inotify_init1", "inotify_add_watch")
# The IPC namespace's objects (``build(ipc=False)``): SysV IPC and POSIX message queues.
IPC: Final = (
    "shmget",
    "shmat",
    "shmdt",
    "shmctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
)
# Numbers of recent system calls an older libseccomp may not know by name: since Linux 5.1 new
# system calls have one number on every architecture (asm-generic's unified table).
_UNIFIED: Final[dict[str, int]] = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "open_tree_attr": 467,
}


class _SockFprog(ctypes.Structure):
    """struct sock_fprog: the program handed to seccomp(2)."""

    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
_libc.prctl.restype = ctypes.c_int


class Filter:
    """A compiled filter: ``install`` loads it into the calling process, all threads included.

    Built in the worker, used in its forked children: the program and the structure that points
    at it are ready, so installing costs one prctl and one seccomp system call.
    """

    __slots__ = ("_buffer", "_nr", "_program", "instructions", "ipc", "mount", "network", "unix_sockets")

    def __init__(
        self, program: bytes, *, network: bool, unix_sockets: bool, ipc: bool = True, mount: bool = False
    ) -> None:
        count, rest = divmod(len(program), _SOCK_FILTER_SIZE)
        if rest or not 0 < count <= _BPF_MAXINSNS:
            raise ValueError(f"not a BPF program of 1 to {_BPF_MAXINSNS} instructions: {len(program)} bytes")
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._program = _SockFprog(count, ctypes.addressof(self._buffer))
        self._nr = ctypes.c_long(_nr_seccomp())
        self.instructions = count
        self.network = network
        self.unix_sockets = unix_sockets
        self.ipc = ipc
        self.mount = mount  # it lets mount(2) through: ``mount_closer`` must follow

    @property
    def program(self) -> bytes:
        """The raw BPF program (``struct sock_filter`` array, native byte order)."""
        return self._buffer.raw

    def warm(self) -> None:
        """Run ``install``'s code path without its effect (a NULL program fails with EFAULT).

        For an idle child: the first ctypes calls after a fork copy the pages they touch, which
        costs more than the kernel's own work (about 100 microseconds here); warmed, the block's
        ``install`` pays only the system calls.
        """
        _libc.prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
        _libc.syscall(self._nr, _MODE_FILTER, _FLAG_TSYNC, ctypes.c_void_p(None))
        ctypes.get_errno()

    def install(self) -> None:
        """Filter every thread of this process (and all it starts or forks), for good.

        Sets no_new_privs first (seccomp requires it without CAP_SYS_ADMIN; TSYNC extends it to
        the other threads). OSError when the kernel refuses, or when a thread cannot be given the
        filter (TSYNC then names it): the process must then not run the block.
        """
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(code)}")
        result = _libc.syscall(self._nr, _MODE_FILTER, _FLAG_TSYNC, ctypes.byref(self._program))
        if result == -1:
            code = ctypes.get_errno()
            raise OSError(code, f"seccomp(SECCOMP_SET_MODE_FILTER, TSYNC): {os.strerror(code)}")
        if result != 0:
            raise OSError(errno.EBUSY, f"seccomp TSYNC: thread {result} cannot take the filter")


def _nr_seccomp() -> int:
    machine = os.uname().machine
    number = _NR_SECCOMP.get(machine)
    if number is None:
        raise OSError(errno.ENOSYS, f"seccomp filter: unsupported architecture {machine}")
    return number


def available() -> str | None:
    """None when this process can install the filter; else why not (for the log)."""
    machine = os.uname().machine
    if machine not in _NR_SECCOMP:
        return f"unsupported architecture {machine}"
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:
        return f"libseccomp is not available: {exc}"
    if _libc.prctl(_PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
        return f"the kernel has no seccomp: {os.strerror(ctypes.get_errno())}"
    # A NULL program: a kernel that knows filters and TSYNC reaches the copy and says EFAULT.
    result = _libc.syscall(
        ctypes.c_long(_NR_SECCOMP[machine]), _MODE_FILTER, _FLAG_TSYNC, ctypes.c_void_p(None)
    )
    code = ctypes.get_errno()
    if result == -1 and code == errno.EFAULT:
        return None
    return f"seccomp filters with TSYNC are not available: {os.strerror(code) if result == -1 else result}"


def build(*, network: bool, unix_sockets: bool, ipc: bool = True, mount: bool = False) -> Filter:
    """Compile the sandbox's filter (in the worker, once): sockets as the arguments allow.

    ``network``: sockets of every family (the rest of the filter is the same);
    ``unix_sockets``: ``socket(AF_UNIX)`` (socketpair is always allowed); ``ipc``: SysV IPC and
    POSIX message queues. ``mount``: mount(2) left allowed, for a child that installs the filter
    while idle and still mounts its block's directory when the block comes: ``mount_closer``,
    installed then, denies it (seccomp filters stack: the stricter answer wins).
    """
    import pyseccomp as sc

    rules = sc.SyscallFilter(sc.ALLOW)
    rules.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    # A binary tree of system call numbers: shorter paths through the program, so a cheaper
    # install (the kernel emulates the program for every number to cache the constant answers)
    # and cheaper system calls. libseccomp < 2.5 has only the linear layout.
    with contextlib.suppress(OSError):
        rules.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    eperm = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        if not (mount and name == "mount"):
            _add(sc, rules, eperm, name)
    _add(sc, rules, sc.ERRNO(errno.ENOSYS), "clone3")
    # inotify watches files by path, past Landlock (which does not check it) and onto files
    # every block shares (the Python installation): what another conversation imports and
    # opens, and under the process backend the names of the server's own files in /tmp. As
    # absent (ENOSYS): programs that can poll instead (tail -f) fall back to it.
    for name in INOTIFY:
        _add(sc, rules, sc.ERRNO(errno.ENOSYS), name)
    for flag in _CLONE_NAMESPACES:
        _add(sc, rules, eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # Exactly 0 (this process), upper bits included: a pid is an int the kernel truncates.
    for name, arg in SELF_ONLY:
        _add(sc, rules, eperm, name, sc.Arg(arg, sc.NE, 0))
    for name, arg, kind in _TARGET_KINDS:
        _add(sc, rules, eperm, name, sc.Arg(arg, sc.NE, kind))
    # personality(2) takes an unsigned int: exactly 0xffffffff (the query) and nothing else.
    _add(sc, rules, eperm, "personality", sc.Arg(0, sc.NE, _PERSONALITY_QUERY))
    for request in (_TIOCSTI, _TIOCLINUX):
        _add(sc, rules, eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, _LOW32, request))
    if not network:
        # Any 64-bit value but exactly AF_UNIX, upper bits included: the kernel truncates them.
        _add(sc, rules, sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.NE, _AF_UNIX))
    if not unix_sockets:
        _add(sc, rules, eperm, "socket", sc.Arg(0, sc.MASKED_EQ, _LOW32, _AF_UNIX))
    if not ipc:
        for name in IPC:
            _add(sc, rules, sc.ERRNO(errno.ENOSYS), name)
    return Filter(_export(rules), network=network, unix_sockets=unix_sockets, ipc=ipc, mount=mount)


def mount_closer() -> Filter:
    """The second stage of a filter built with ``mount=True``: mount(2) denied with EPERM, as the
    whole filter does, and nothing else (a system call of another ABI kills, as there). A few
    instructions: installing it costs a fraction of the whole filter's install, which the
    kernel emulates for every system call number."""
    import pyseccomp as sc

    rules = sc.SyscallFilter(sc.ALLOW)
    rules.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    _add(sc, rules, sc.ERRNO(errno.EPERM), "mount")
    return Filter(_export(rules), network=True, unix_sockets=True)


def _add(sc: Any, rules: Any, action: int, name: str, *args: Any) -> None:
    """One rule for ``name``, by number when libseccomp is too old to know the name; a system
    call this architecture does not have is skipped (nothing can call it)."""
    number = sc.resolve_syscall(sc.Arch.NATIVE, name)
    if number < 0:
        number = _UNIFIED.get(name, -1)
    if number < 0:
        return
    rules.add_rule(action, number, *args)


class _Fd:
    """What libseccomp's export needs of a file: its descriptor."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd


@contextlib.contextmanager
def _scratch_fd() -> Iterator[int]:
    """An anonymous file for the export (a memfd; a temporary file where there is none)."""
    try:
        fd = os.memfd_create("sabre-seccomp", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd, path = tempfile.mkstemp(prefix="sabre-seccomp-")
        os.unlink(path)
    try:
        yield fd
    finally:
        os.close(fd)


def _export(rules: Any) -> bytes:
    """The filter as a raw BPF program, compiled by libseccomp."""
    with _scratch_fd() as fd:
        rules.export_bpf(_Fd(fd))
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
