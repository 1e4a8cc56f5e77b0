"""The sandbox's side: a worker set up for its backend, and each forked child narrowed to its
block's directory and stripped of its privileges before any code of the block runs (see the
package's docstring). Imported by the worker and the child: standard library only."""

from __future__ import annotations

import _posixsubprocess
import contextlib
import ctypes
import errno
import functools
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from app.runtime import landlock, seccomp
from app.runtime.isolation.backends import Backend
from app.runtime.isolation.host import ETC, TOP_LEVEL, readonly_paths
from app.runtime.isolation.identity import Identity, conversation_identity, reachable
from app.runtime.isolation.linux import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWUSER,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    NO_CAPS,
    NO_CAPS_HEADER,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    capability_sets,
    check,
    drop_bounding_set,
    drop_capabilities,
    libc,
    mount,
    prctl,
    write_file,
)

# The tmpfs that covers the workspaces directory in a child: it only holds the mount point of
# the block's own directory, and is made read-only before the code runs.
_COVER_OPTIONS: Final = "mode=0755,size=64k,nr_inodes=256"
# /tmp and /dev/shm of a child before its block sets their size (the block's file_size_mb).
_DEFAULT_TMP_BYTES: Final = 50 << 20
# Where a bwrap child mounts fresh tmpfs: what lies below them is hidden from its block.
_FRESH_TMPFS: Final = ("/tmp", "/dev/shm")


class _State:
    """How this worker (and its children, which inherit it) isolates blocks."""

    backend: Backend | None = None  # None: not a configured worker (tests, the dry run)
    workspaces: str | None = None
    identity: Identity | None = None
    # Child, bwrap: the real workspaces directory (under the cover), until the block enters.
    root_fd = -1
    # The cover is visible (the workspaces are not under /tmp or /dev/shm); set by the worker.
    sealable = False
    tmp_bytes = 0
    # Child, bwrap: privileges are held until ``enter``; threads that dropped theirs.
    privileged = False
    main_tid = 0
    unprivileged_tids: set[int] = set()  # noqa: RUF012 (module state, one per process)
    # bwrap: the filter below leaves mount(2) open for ``enter``, which then installs this.
    mount_closer: seccomp.Filter | None = None
    # The syscall filter every block gets (built once, in the worker); process: what else a
    # block may read (the worker's matplotlib cache), and the child's Landlock ruleset.
    seccomp: seccomp.Filter | None = None
    filtered = False  # the child installed ``seccomp`` (``after_fork``)
    readable: list[str] = []  # noqa: RUF012 (module state, one per process)
    # Computed once in the worker, before it forks: what each child's set-up would otherwise
    # compute again (pathlib work, about 0.5 ms of CPU per fresh block). bwrap: the read-only
    # paths that a child's fresh /tmp and /dev/shm would hide; process: what a block may read
    # besides ``readable``.
    hidden: tuple[Path, ...] = ()
    system_readable: tuple[str, ...] = ()
    # bwrap: this worker holds a network and an IPC namespace of its own, which its children
    # share one after another (``worker_namespaces``); otherwise each child makes both. And
    # whether the next child must make its own all the same (``check_worker_namespaces``).
    worker_namespaces = False
    shared_net_dirty = False
    ruleset: landlock.Ruleset | None = None
    hides_processes = False  # see ``_hide_other_processes``


def configure_worker(backend: Backend, *, workspaces: str | None, identity: Identity | None) -> None:
    """Set this worker up for ``backend``; called first thing in the worker, before any import.

    bwrap: when started as root (in the pool's user namespace), switch to ``identity`` now;
    become non-dumpable. Both: no-new-privileges (no setuid program raises a block's rights).
    """
    _State.backend = backend
    _State.workspaces = workspaces
    _State.identity = identity
    if backend == "bwrap":
        _State.hidden = tuple(p for p in readonly_paths() if any(p.is_relative_to(t) for t in _FRESH_TMPFS))
        _State.sealable = workspaces is not None and not any(
            os.path.commonpath([workspaces, top]) == top for top in _FRESH_TMPFS
        )
    else:
        _State.system_readable = tuple(_system_readable())
    os.environ.pop("PWD", None)  # bubblewrap's --chdir sets it; the environment stays as given
    if backend == "bwrap":
        # Else the pool gives each worker a zygote, and so a PID namespace, of its own.
        _State.hides_processes = landlock.scopes_signals() and _hide_other_processes()
        if os.getuid() == 0:
            if identity is None:
                raise RuntimeError("a bwrap worker started as root needs --identity")
            drop_bounding_set()
            os.setgroups([])
            os.setresgid(identity.gid, identity.gid, identity.gid)
            os.setresuid(identity.uid, identity.uid, identity.uid)  # clears every capability
        else:
            drop_capabilities()  # and with the permitted set, the ambient one bubblewrap set
        held = capability_sets()
        if held.get("CapPrm", 1) or held.get("CapAmb", 1):
            raise RuntimeError("the worker still holds capabilities after its set-up")
        prctl(PR_SET_DUMPABLE, 0)
    elif os.getuid() == 0 and identity is not None:
        # process, as root: its blocks will run as ``identity``, which must reach Python and
        # the workspaces by their paths.
        needed = [*readonly_paths(), *([Path(workspaces)] if workspaces else [])]
        make_reachable(needed, identity)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    watch_forks()
    why = seccomp.available()
    if why is not None:
        raise RuntimeError(f"the sandbox's seccomp filter cannot be installed here: {why}")
    # bwrap: the code sees no host socket file, so AF_UNIX sockets are harmless; process: a
    # block could connect to the host's (PostgreSQL's, Redis's), so only socketpair() remains.
    # No SysV IPC nor POSIX message queues: their objects belong to the IPC namespace, not to
    # a process. process: the host's, where a segment outlives the block and, once its worker
    # is retired, any cgroup that bounds it; bwrap: the block's own, but the kernel frees that
    # some time after the block's last process is gone, so the next block in the worker starts
    # with the segment still charged to its cgroup (and may be killed for its memory).
    # Each child installs it while idle (``after_fork``): the kernel's work on the whole program
    # (about 0.1 ms) is then off the block's path. bwrap: with mount(2) still allowed for
    # ``enter``, which closes it with a filter of a few instructions before the code runs.
    bwrap = backend == "bwrap"
    _State.seccomp = seccomp.build(network=False, unix_sockets=bwrap, ipc=False, mount=bwrap)
    _State.mount_closer = seccomp.mount_closer() if bwrap else None
    if backend == "process" and landlock.abi() < 1:
        raise RuntimeError(
            "the process sandbox needs Landlock (Linux 5.13+, enabled in the kernel's LSM list) "
            "to confine blocks' files; use the bwrap sandbox"
        )


def _hide_other_processes() -> bool:
    """bwrap: mount this namespace's /proc again with ``hidepid=ptraceable``, so a process sees
    in it only the processes it may ptrace-read. A block's Landlock domain (``enter``) makes
    that its own processes: not the zygote, not its worker, not another conversation's block
    in the same PID namespace (workers of one zygote may share it only then: ``hides_processes``).

    Needs CAP_SYS_ADMIN over the PID namespace, which bubblewrap grants the zygote for this and
    ``configure_worker`` drops. An unprivileged server's bubblewrap runs the zygote in a second
    user namespace, without it (EPERM): False then.

    The new /proc covers bubblewrap's, and with it the read-only binds bubblewrap put over
    /proc/irq and /proc/bus: they are made again here.
    """
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    try:
        mount("proc", "/proc", "proc", flags, "hidepid=ptraceable")
    except OSError:
        return False
    for covered in ("/proc/irq", "/proc/bus"):
        if os.path.isdir(covered):
            mount(covered, covered, None, MS_BIND | MS_REC)
            mount(None, covered, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    return True


def hides_processes() -> bool:
    """Whether a block of this worker sees only its own processes in /proc (bwrap), so that
    workers may share a PID namespace: the zygote tells the pool (its ``start`` report)."""
    return _State.hides_processes


def backend() -> Backend | None:
    """The backend this worker was configured for (None outside a worker)."""
    return _State.backend


def allow_reading(path: str) -> None:
    """process backend: let blocks read ``path`` too (the worker's matplotlib cache)."""
    _State.readable.append(path)


def block_tmp(pid: int) -> str:
    """process backend: the private temporary directory of the block run by child ``pid``
    (``TMPDIR``), inside the workspaces; the worker removes it when the child has ended."""
    return os.path.join(_State.workspaces or tempfile.gettempdir(), ".sabre-tmp", str(pid))


def remove_block_tmp(pid: int) -> None:
    """process backend: remove what the block of child ``pid`` left in its temporary directory."""
    if _State.backend == "process":
        shutil.rmtree(block_tmp(pid), ignore_errors=True)


def make_reachable(paths: Sequence[Path], identity: Identity) -> None:
    """Let ``identity`` reach ``paths`` in this worker's own mount namespace (root only).

    Each directory above them that ``identity`` cannot pass through (``/root`` when Python was
    installed there) is covered, for this worker and its children only, by an empty tmpfs
    holding nothing but binds of the paths below it: the rest of it disappears from their view.
    """
    blocked: dict[Path, list[Path]] = {}
    for path in paths:
        stop = next((d for d in reversed([path, *path.parents]) if not reachable(d, identity)), None)
        if stop is not None:
            blocked.setdefault(stop, []).append(path)
    if not blocked:
        return
    try:
        check(libc.unshare(CLONE_NEWNS), "unshare")
    except OSError as exc:
        raise RuntimeError(
            f"the sandbox user {identity} cannot reach {', '.join(map(str, blocked))} and this "
            f"worker cannot make a mount namespace to fix that ({exc}): install bubblewrap, "
            "run the server as an unprivileged user, or install Python where others can read it"
        ) from exc
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    for cover in sorted(blocked, key=lambda d: len(d.parts)):
        if any(cover.is_relative_to(other) and cover != other for other in blocked):
            continue  # under another cover: handled with it
        below = [p for d, ps in blocked.items() if d.is_relative_to(cover) for p in ps]
        fds = [os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in below]
        mount("tmpfs", str(cover), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        for path, fd in zip(below, fds, strict=True):
            os.makedirs(path, 0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", str(path), None, MS_BIND | MS_REC)
            os.close(fd)


def worker_namespaces() -> None:
    """bwrap, in a worker the zygote has just forked (still single-threaded): a network and an
    IPC namespace of the worker's own, in a user namespace of its own (an unprivileged process
    can make them only with one), for its children to share one after another instead of
    making both for each fresh child: that was about 0.5 ms of a child's CPU and 1 ms of its
    set-up (a C loop of fork and unshare; ``bench/fork_bench.py`` shows it as its "namespaces,
    mounts" column), and the kernel's teardown of one network namespace per block besides.

    What the per-child namespaces kept apart stays apart: a worker runs one child at a time
    and kills everything a block left before it forks the next one, so the sockets (unix ones,
    the only kind a block may open) of one conversation's block die with it, but for one kept
    in flight, which ``check_worker_namespaces`` finds; blocks side by side run in other
    workers, in namespaces of their own.
    Each child still makes its own user and mount namespaces (``_prepare``). The worker keeps
    no capability in its namespace and stays non-dumpable: a block cannot ptrace it."""
    if _State.backend != "bwrap":
        return
    uid, gid = os.getuid(), os.getgid()
    prctl(PR_SET_DUMPABLE, 1)  # to write its own uid_map
    check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC), "unshare")
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", f"{uid} {uid} 1\n")
    write_file("/proc/self/gid_map", f"{gid} {gid} 1\n")
    drop_capabilities()  # a new user namespace gives every capability in it
    prctl(PR_SET_DUMPABLE, 0)
    held = capability_sets()
    if held.get("CapEff", 1) or held.get("CapPrm", 1) or held.get("CapAmb", 1):
        raise RuntimeError("the worker still holds capabilities in its own namespaces")
    _State.worker_namespaces = True


def check_worker_namespaces() -> None:
    """bwrap, in the worker before it forks a child: whether that child may use the worker's
    network namespace, which must then hold no socket at all. The worker's own sockets are not
    in it (they were made before it, or are closed by now), and a block's die with its
    processes, but for one kept only by a unix socket in flight to itself (SCM_RIGHTS): that
    lives, abstract name and all, until the kernel's collector of such cycles next runs, on
    some later release of a unix socket anywhere on the host. A later conversation's block
    would then find the name taken and listed in /proc/net/unix (a channel between them), so
    while one is there each child makes a network and IPC namespace of its own again."""
    if not _State.worker_namespaces:
        return
    try:
        with open("/proc/self/net/unix", "rb") as table:
            lines = table.read().count(b"\n")
    except OSError:
        lines = 2  # cannot tell: as if something were left
    _State.shared_net_dirty = lines > 1  # a header line, then one line per socket


def after_fork() -> None:
    """In a freshly forked child, while it is still single-threaded: prepare its private view
    (``_prepare``), then install the system call filter (bwrap: mount(2) still open, for
    ``enter``), all before anything of a block reaches the child."""
    _prepare()
    if _State.seccomp is not None:
        _State.seccomp.install()
        _State.filtered = True
        if _State.mount_closer is not None:
            _State.mount_closer.warm()


def _prepare() -> None:
    """The child's private view, while it is still single-threaded.

    bwrap: see the module docstring; nothing here depends on the block. process, as root: drop
    the groups and the bounding set now; ``enter`` switches the user when the block arrives
    (until then the idle child is out of reach of other blocks' signals).
    Both: touch what ``enter`` will run, so the block does not pay a fresh fork's page copies.
    """
    global _fork_refused
    _fork_refused = False
    # The OOM killer (the worker's cgroup's, or the host's) takes the block's processes before
    # their worker or the server: raising one's own score needs no privilege; forks inherit it.
    # (bwrap: the worker is not dumpable, so its child's /proc/self is not its own to write
    # until it is made dumpable below: it raises its score there.)
    if _State.backend != "bwrap":
        with contextlib.suppress(OSError):
            write_file("/proc/self/oom_score_adj", "1000")
    identity = _State.identity
    if _State.seccomp is not None:
        _State.seccomp.warm()
    _State.filtered = False
    if _State.backend == "process":
        _State.ruleset = landlock.Ruleset(deny_tcp=True, scope=True)
        _State.ruleset.allow(read_only=_process_readable(), read_write=["/dev/null"])
        _State.ruleset.warm()
    if _State.backend == "process" and identity is not None and os.getuid() == 0:
        drop_bounding_set()
        os.setgroups([])
        os.setresgid(identity.gid, identity.gid, identity.gid)  # signals go by uid: still root
        _warm_enter()
        return
    if _State.backend != "bwrap":
        return
    uid, gid = os.getuid(), os.getgid()
    prctl(PR_SET_DUMPABLE, 1)  # to write its own uid_map (and its OOM score)
    with contextlib.suppress(OSError):
        write_file("/proc/self/oom_score_adj", "1000")
    # A network namespace apart from other conversations' blocks (blocks have no network):
    # abstract unix socket names and /proc/net are per network namespace, so a block side by
    # side can neither take a name before this one nor list its sockets. The worker's own, where
    # it made one (``worker_namespaces``) and no block left a socket in it: its children come
    # one after another (``check_worker_namespaces``).
    flags = CLONE_NEWUSER | CLONE_NEWNS
    if not _State.worker_namespaces or _State.shared_net_dirty:
        flags |= CLONE_NEWIPC | CLONE_NEWNET
    check(libc.unshare(flags), "unshare")
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", f"{uid} {uid} 1\n")
    write_file("/proc/self/gid_map", f"{gid} {gid} 1\n")
    prctl(PR_SET_DUMPABLE, 1)  # a change of user namespace resets it
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    private_tmp = (MS_NOSUID | MS_NODEV, f"mode=1777,size={_DEFAULT_TMP_BYTES}")
    workspaces = _State.workspaces
    if workspaces is not None:
        _State.root_fd = os.open(workspaces, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        mount("tmpfs", workspaces, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, _COVER_OPTIONS)
    # The installation may live under /tmp (a checkout there): keep handles on what the fresh
    # /tmp and /dev/shm would hide, and bind it back read-only on top of them.
    hidden = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) for path in _State.hidden]
    mount("tmpfs", "/tmp", "tmpfs", *private_tmp)
    mount("tmpfs", "/dev/shm", "tmpfs", *private_tmp)
    # Pseudo-terminals of its own (/dev/ptmx is a link to pts/ptmx): on the worker's instance a
    # block could open another conversation's terminal (/dev/pts/N), read it and type into it.
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    for path, fd in hidden:
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", str(path), None, MS_BIND | MS_REC)
        mount(None, str(path), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    _State.tmp_bytes = _DEFAULT_TMP_BYTES
    if landlock.scopes_signals():
        # Blocks share the worker's PID namespace (and, side by side, with other conversations'
        # blocks): no signal (kill -1 included) and no abstract unix socket may reach outside the
        # block's own processes. Files stay the mounts' business.
        _State.ruleset = landlock.Ruleset(deny_tcp=False, scope=True, files=False)
        _State.ruleset.warm()
    # This namespace may hold no further user namespace: the code gets no namespace of its own.
    write_file("/proc/sys/user/max_user_namespaces", "0")
    drop_bounding_set()
    _State.privileged = True
    _State.main_tid = threading.get_native_id()
    _State.unprivileged_tids = set()
    _warm_enter()


def _warm_enter() -> None:
    """Run what ``enter`` runs, without its effects (failing calls, no-op arguments)."""
    root = _State.workspaces or "/"
    with contextlib.suppress(OSError):
        _relative_parts(os.path.join(root, "x"), root)
    with contextlib.suppress(OSError):
        _relative_parts("/", root)
    if _State.backend == "bwrap":
        with contextlib.suppress(OSError):
            os.close(os.open(".", _WALK, dir_fd=_State.root_fd))
        with contextlib.suppress(OSError):
            os.mkdir("/proc/1")  # EEXIST (and read-only)
        with contextlib.suppress(OSError):
            mount("/proc/self/fd/-1", "/nonexistent", None, MS_BIND)
        with contextlib.suppress(OSError):
            _check_threads(wait_seconds=0)
        NO_CAPS_HEADER.version = 0  # an invalid version: capset fails, changing nothing
        with contextlib.suppress(OSError):
            check(libc.capset(ctypes.byref(NO_CAPS_HEADER), NO_CAPS), "capset")
        os.path.exists(f"/proc/self/task/{threading.get_native_id()}")
    else:
        os.setresuid(-1, -1, -1)
        _rearm_parent_death()
    os.chdir(os.getcwd())


def thread_started() -> None:
    """First call of every thread the child starts before its block (the output pump): drop
    this thread's capabilities, which ``enter`` cannot drop for it."""
    if _State.privileged and threading.get_native_id() != _State.main_tid:
        drop_capabilities()
        _State.unprivileged_tids.add(threading.get_native_id())


def enter(workdir: str, limits: Mapping[str, Any]) -> None:
    """Give the block ``workdir`` and nothing else, drop what privileges are left, chdir there.

    Called in the block's process, before its code or its snapshot is loaded. OSError when the
    directory cannot be entered (the block then fails without running).
    """
    if _State.backend == "bwrap":
        _narrow(workdir, tmpfs_bytes(limits) // 2)
    elif _State.backend == "process":
        _confine_process(workdir)
    else:
        os.chdir(workdir)
    if _State.seccomp is not None and not _State.filtered:
        _State.seccomp.install()  # a child prepared without ``after_fork``
        _State.filtered = True
    if _State.seccomp is not None and _State.seccomp.mount:
        if _State.mount_closer is None:
            raise OSError(errno.EPERM, "the filter leaves mount(2) open and nothing closes it")
        _State.mount_closer.install()


def tmpfs_bytes(limits: Mapping[str, Any]) -> int:
    """bwrap: the memory a block's /tmp and /dev/shm may hold together (each gets half). They
    are memory, so the block's address space limit is lowered by as much: what the code maps
    and what it stores there stay within ``memory_mb`` together. A quarter of the memory at
    most, and no more than one file may be large. 0 for the process backend (no tmpfs)."""
    if _State.backend != "bwrap":
        return 0
    return min(int(limits["file_size_mb"]), int(limits["memory_mb"]) // 4) << 20


def _process_readable() -> list[str]:
    """What a block of the process backend may read besides its directories: the system's
    programs and libraries, the Python installation and ``app``, a few /etc files, /proc, the
    random devices, and what the worker allowed (``allow_reading``). Not the data directory
    (the store, other conversations), not /tmp."""
    return [*_State.system_readable, *_State.readable]


def _system_readable() -> list[str]:
    """The fixed part of ``_process_readable``, computed once by ``configure_worker``."""
    paths = ["/usr", *(f"/{name}" for name in TOP_LEVEL), *(f"/etc/{name}" for name in ETC)]
    paths += [str(p) for p in readonly_paths()]
    return [*paths, "/proc", "/dev/zero", "/dev/random", "/dev/urandom", "/sys/devices/system/cpu"]


def _confine_process(workdir: str) -> None:
    """process backend: enter ``workdir``, give the block a private TMPDIR, run as the sandbox
    identity (server as root), then confine it with Landlock: only its directories writable,
    no TCP, no signals to or abstract sockets of processes outside its own domain."""
    tmp = block_tmp(os.getpid())
    os.makedirs(os.path.dirname(tmp), mode=0o711, exist_ok=True)
    os.mkdir(tmp, 0o700)
    os.chdir(workdir)
    identity = conversation_identity(workdir, base=_State.identity, backend="process")
    if identity is not None and os.getuid() == 0:
        # As root: the directory may lie below directories the identity cannot pass through.
        os.setresgid(identity.gid, identity.gid, identity.gid)
        os.chown(tmp, identity.uid, identity.gid)
        os.setresuid(identity.uid, identity.uid, identity.uid)  # every thread; clears capabilities
        _rearm_parent_death()  # a change of user clears it
    os.environ["TMPDIR"] = tmp
    tempfile.tempdir = None  # chosen again from TMPDIR
    ruleset = _State.ruleset
    if ruleset is None:
        raise OSError(errno.EPERM, "the block's Landlock ruleset was not prepared")
    _State.ruleset = None
    ruleset.allow(read_write=[workdir, tmp])
    ruleset.enforce()


def _rearm_parent_death() -> None:
    parent = os.getppid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


_WALK: Final = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _relative_parts(workdir: str, root: str) -> list[str]:
    """The components of ``workdir`` below ``root`` (both absolute, normalised by the pool);
    OSError if it is not strictly below it."""
    parts = workdir[len(root) :].split("/")
    if not workdir.startswith(root) or parts[0] != "" or any(p in ("", ".", "..") for p in parts[1:]):
        raise OSError(errno.EACCES, f"{workdir} is not inside the workspaces directory {root}")
    if len(parts) < 2:
        raise OSError(errno.EACCES, f"{workdir} is the workspaces directory itself")
    return parts[1:]


def _narrow(workdir: str, tmp_bytes: int) -> None:
    workspaces = _State.workspaces
    if workspaces is None or _State.root_fd < 0:
        raise OSError(errno.EACCES, "this worker has no workspaces directory")
    parts = _relative_parts(workdir, workspaces.rstrip("/"))
    opened: list[int] = []
    try:
        fd = _State.root_fd
        for part in parts:  # a symbolic link on the way fails (O_NOFOLLOW + O_DIRECTORY)
            fd = os.open(part, _WALK, dir_fd=fd)
            opened.append(fd)
        # The mount point, in the cover (or in the private /tmp when the workspaces are there).
        try:
            os.mkdir(workdir, 0o755)
        except FileNotFoundError:
            os.makedirs(workdir, 0o755, exist_ok=True)
        except FileExistsError:
            pass
        mount(f"/proc/self/fd/{fd}", workdir, None, MS_BIND)
    finally:
        for fd in opened:
            os.close(fd)
        os.close(_State.root_fd)
        _State.root_fd = -1
    if _State.sealable:
        sealed = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        mount(None, workspaces, None, sealed)
    if tmp_bytes != _State.tmp_bytes:
        for path in _FRESH_TMPFS:
            mount(None, path, None, MS_REMOUNT | MS_NOSUID | MS_NODEV, f"size={tmp_bytes}")
        _State.tmp_bytes = tmp_bytes
    _check_threads()
    drop_capabilities()
    _State.privileged = False
    os.chdir(workdir)
    if _State.ruleset is not None:
        ruleset, _State.ruleset = _State.ruleset, None
        ruleset.enforce()


def _check_threads(wait_seconds: float = 1.0) -> None:
    """Every other thread of this process must have dropped its capabilities (a thread that is
    still starting gets ``wait_seconds``): capabilities are per thread."""
    # Fast path: procfs counts a process's threads in the link count of its task directory;
    # this one plus the (live) threads that dropped theirs is all of them.
    tids = _State.unprivileged_tids
    if os.stat("/proc/self/task").st_nlink - 2 == 1 + len(tids) and all(
        os.path.exists(f"/proc/self/task/{tid}") for tid in tids
    ):
        return
    deadline = time.monotonic() + wait_seconds
    while True:
        others = {int(tid) for tid in os.listdir("/proc/self/task")} - {threading.get_native_id()}
        if others <= _State.unprivileged_tids:
            return
        if time.monotonic() >= deadline:
            raise OSError(errno.EPERM, "a thread of the block's process still holds privileges")
        time.sleep(0.001)


_fork_refused = False


def _noting_refusal(function: Callable[..., Any]) -> Callable[..., Any]:
    def create(*args: Any, **kwargs: Any) -> Any:
        global _fork_refused
        try:
            return function(*args, **kwargs)
        except BlockingIOError:  # EAGAIN: RLIMIT_NPROC (or the pid space) is exhausted
            _fork_refused = True
            raise

    return functools.update_wrapper(create, function)


def watch_forks() -> None:
    """Make ``os.fork``, ``os.posix_spawn[p]`` and subprocess's ``fork_exec`` note when the
    kernel refuses a new process, so a block that dies of it ends as ``limit: processes N``
    rather than with a BlockingIOError that may as well come from a socket."""
    for module, name in (
        (os, "fork"),
        (os, "forkpty"),
        (os, "posix_spawn"),
        (os, "posix_spawnp"),
        (_posixsubprocess, "fork_exec"),
    ):
        function = getattr(module, name, None)
        if function is not None:
            setattr(module, name, _noting_refusal(function))


def fork_refused() -> bool:
    """Whether this process was refused a new process (``watch_forks``)."""
    return _fork_refused
