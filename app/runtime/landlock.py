"""Landlock for the sandbox child: the files it may touch, no TCP, no signals out of its domain.

Written on the three system calls (``landlock_create_ruleset``, ``landlock_add_rule``,
``landlock_restrict_self``) with the structures of ``linux/landlock.h``, because the ``landlock``
package knows neither the network nor scopes. ``restrict`` handles every file-system right the
running kernel's ABI knows (rights a newer ABI added are dropped on an older kernel, as the
kernel documentation describes), so whatever is not granted under a rule's path is denied, to
root as much as to anyone: Landlock does not care about uids or capabilities.

Best effort by ABI: 1 files; 2 renames and links across directories (without it they are always
denied); 3 truncation; 4 TCP bind and connect; 5 device ioctls; 6 scopes (abstract unix sockets
and signals outside the domain); 8 all threads at once. Without ABI 8 a domain covers only the
calling thread (and the threads and processes it starts afterwards), so ``restrict`` refuses to
run while the process has other threads: they would stay unrestricted, in the same address space.

A restricted process can no longer mount or unmount anything: restrict after the child's own
mounts. ``Ruleset`` splits ``restrict`` in two: the fixed paths added (and ``warm`` run) while the
child is idle, the block's own paths and ``enforce`` when the block arrives.

Imported by the sandbox worker: standard library only. Computed once at import (in the worker):
the ABI and the ruleset attributes; a child pays the system calls and one ``open`` per path.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Sequence
from typing import Final

# System call numbers: the same on every architecture (asm-generic's unified table, Linux 5.13).
_NR_CREATE_RULESET: Final = ctypes.c_long(444)
_NR_ADD_RULE: Final = ctypes.c_long(445)
_NR_RESTRICT_SELF: Final = ctypes.c_long(446)
_CREATE_RULESET_VERSION: Final = 1
_RULE_PATH_BENEATH: Final = ctypes.c_long(1)
_RESTRICT_SELF_TSYNC: Final = 1 << 3  # ABI 8
_PR_SET_NO_NEW_PRIVS: Final = 38
_PR_GET_NO_NEW_PRIVS: Final = 39
_ZERO: Final = ctypes.c_long(0)

# enum landlock_access_fs
_EXECUTE: Final = 1 << 0
_WRITE_FILE: Final = 1 << 1
_READ_FILE: Final = 1 << 2
_READ_DIR: Final = 1 << 3
_REMOVE_DIR: Final = 1 << 4
_REMOVE_FILE: Final = 1 << 5
_MAKE_CHAR: Final = 1 << 6
_MAKE_DIR: Final = 1 << 7
_MAKE_REG: Final = 1 << 8
_MAKE_SOCK: Final = 1 << 9
_MAKE_FIFO: Final = 1 << 10
_MAKE_BLOCK: Final = 1 << 11
_MAKE_SYM: Final = 1 << 12
_REFER: Final = 1 << 13  # ABI 2
_TRUNCATE: Final = 1 << 14  # ABI 3
_IOCTL_DEV: Final = 1 << 15  # ABI 5
_FS_ABI_1: Final = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
# Rights that mean something on a file that is not a directory (the kernel refuses the others).
_FILE_RIGHTS: Final = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_READ_ONLY: Final = _EXECUTE | _READ_FILE | _READ_DIR
# enum landlock_access_net (ABI 4), landlock scopes (ABI 6)
_NET_BIND_TCP: Final = 1 << 0
_NET_CONNECT_TCP: Final = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET: Final = 1 << 0
_SCOPE_SIGNAL: Final = 1 << 1


class _RulesetAttr(ctypes.Structure):
    """struct landlock_ruleset_attr (the kernel reads as many bytes as its ABI knows)."""

    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    """struct landlock_path_beneath_attr (packed)."""

    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
_libc.prctl.restype = ctypes.c_int


def _probe() -> int:
    version = _libc.syscall(_NR_CREATE_RULESET, None, _ZERO, ctypes.c_long(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def _fs_rights(version: int) -> int:
    """Every file-system right ABI ``version`` knows."""
    rights = _FS_ABI_1 if version >= 1 else 0
    if version >= 2:
        rights |= _REFER
    if version >= 3:
        rights |= _TRUNCATE
    if version >= 5:
        rights |= _IOCTL_DEV
    return rights


_ABI: Final = _probe()
_HANDLED_FS: Final = _fs_rights(_ABI)
# Size of the attributes this ABI reads: 8 bytes (files), 16 (network, ABI 4), 24 (scopes, ABI 6).
_ATTR_SIZE: Final = ctypes.c_long(8 if _ABI < 4 else 16 if _ABI < 6 else 24)
# One prepared attribute structure per (deny_tcp, scope, files).
_ATTRS: Final = {
    (deny_tcp, scope, files): _RulesetAttr(
        _HANDLED_FS if files else 0,
        _NET_BIND_TCP | _NET_CONNECT_TCP if deny_tcp and _ABI >= 4 else 0,
        _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if scope and _ABI >= 6 else 0,
    )
    for deny_tcp in (False, True)
    for scope in (False, True)
    for files in (False, True)
}
_RULE = _PathBeneathAttr()
_RULE_REF: Final = ctypes.byref(_RULE)
_DIRECTORY: Final = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_ANY: Final = os.O_PATH | os.O_CLOEXEC
_RESTRICT_FLAGS: Final = ctypes.c_long(_RESTRICT_SELF_TSYNC if _ABI >= 8 else 0)


def abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is not available (not built or
    not enabled at boot)."""
    return _ABI


def scopes_signals() -> bool:
    """Whether a domain can keep its processes from signalling (and connecting to the abstract
    unix sockets of) processes outside it (ABI 6): what lets blocks of different conversations
    run side by side in one PID namespace."""
    return _ABI >= 6


def _fail(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"landlock: {what}: {os.strerror(code)}")


def _other_threads() -> int:
    """How many threads besides the caller this process has (procfs counts them in the link
    count of /proc/self/task; without /proc, the Python threads)."""
    try:
        return os.stat("/proc/self/task").st_nlink - 3
    except OSError:
        return threading.active_count() - 1


class Ruleset:
    """A ruleset under construction in this process: paths can be added while the child is idle
    (``allow``), so that the block pays only for its own paths and ``enforce``.

    The kernel object is this process's own (an fd, closed on exec and by ``enforce``): a ruleset
    prepared in a worker would be shared with every child it forks.
    """

    __slots__ = ("_fd",)

    def __init__(self, *, deny_tcp: bool, scope: bool, files: bool = True) -> None:
        """``files=False``: the ruleset leaves the file system alone (the bwrap backend confines
        files with mounts) and handles only the network and the scopes asked for."""
        if _ABI < 1:
            raise OSError(errno.EOPNOTSUPP, "landlock: not available in this kernel")
        attrs = _ATTRS[deny_tcp, scope, files]
        if not (attrs.handled_access_fs or attrs.handled_access_net or attrs.scoped):
            raise OSError(errno.EOPNOTSUPP, f"landlock: ABI {_ABI} handles none of what was asked")
        fd = _libc.syscall(_NR_CREATE_RULESET, ctypes.byref(attrs), _ATTR_SIZE, _ZERO)
        if fd < 0:
            raise _fail("cannot create a ruleset")
        self._fd = int(fd)

    def allow(self, *, read_only: Sequence[str] = (), read_write: Sequence[str] = ()) -> None:
        """Grant read and execute (and listing) beneath ``read_only``, every right beneath
        ``read_write``; files get the rights that apply to files; missing paths are skipped."""
        for path in read_only:
            self._add(path, _READ_ONLY & _HANDLED_FS)
        for path in read_write:
            self._add(path, _HANDLED_FS)

    def _add(self, path: str, rights: int) -> None:
        if self._fd < 0:
            raise OSError(errno.EBADF, "landlock: the ruleset was enforced or closed")
        try:  # a directory in one system call; a file in two
            fd = os.open(path, _DIRECTORY)
        except NotADirectoryError:
            try:
                fd = os.open(path, _ANY)
            except (FileNotFoundError, NotADirectoryError):
                return
            rights &= _FILE_RIGHTS
        except FileNotFoundError:
            return
        try:
            _RULE.allowed_access = rights
            _RULE.parent_fd = fd
            added = _libc.syscall(_NR_ADD_RULE, ctypes.c_long(self._fd), _RULE_PATH_BENEATH, _RULE_REF, _ZERO)
            if added != 0:
                raise _fail(f"cannot add a rule for {path}")
        finally:
            os.close(fd)

    def warm(self) -> None:
        """Run ``enforce``'s code path without its effect (no ruleset: EBADF), for an idle child:
        the first calls after a fork copy the pages they touch, which costs more than the
        system calls themselves."""
        _other_threads()
        _libc.prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
        _libc.syscall(_NR_RESTRICT_SELF, ctypes.c_long(-1), _RESTRICT_FLAGS)
        ctypes.get_errno()

    def enforce(self) -> int:
        """Confine this process (every thread with ABI 8; else it must have no other thread) to
        the ruleset, for good, and close it; returns the ABI. Sets no_new_privs."""
        if self._fd < 0:
            raise OSError(errno.EBADF, "landlock: the ruleset was enforced or closed")
        try:
            if _ABI < 8 and (others := _other_threads()) > 0:
                raise OSError(
                    errno.EBUSY,
                    f"landlock: ABI {_ABI} restricts the calling thread only and this process has "
                    f"{others} other thread(s): enforce before starting threads",
                )
            if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise _fail("cannot set no_new_privs")
            if _libc.syscall(_NR_RESTRICT_SELF, ctypes.c_long(self._fd), _RESTRICT_FLAGS) != 0:
                raise _fail("cannot enforce the ruleset")
        finally:
            self.close()
        return _ABI

    def close(self) -> None:
        """Drop the ruleset without enforcing it (idempotent)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def restrict(*, read_only: Sequence[str], read_write: Sequence[str], deny_tcp: bool, scope: bool) -> int:
    """Confine this process, for good, to what the arguments allow; returns the ABI used.

    ``read_only``: files or directories it may read and execute (directories: list too);
    ``read_write``: everything beneath them; nothing else of the file system. ``deny_tcp``:
    no TCP bind or connect at all (ABI 4). ``scope``: no signals to, and no abstract unix
    socket connections with, processes outside the domain (ABI 6). Sets no_new_privs.
    OSError when Landlock is unavailable, when other threads would escape the domain (ABI < 8),
    or when the kernel refuses. ``Ruleset`` does the same in two steps.
    """
    ruleset = Ruleset(deny_tcp=deny_tcp, scope=scope)
    try:
        ruleset.allow(read_only=read_only, read_write=read_write)
        return ruleset.enforce()
    finally:
        ruleset.close()
