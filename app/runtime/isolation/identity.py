"""Who blocks run as when the server is root, and the files that identity must own or reach."""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from app.runtime.isolation.backends import Backend


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


def adopt(path: str | Path, identity: Identity | None, *, mode: int | None = None) -> None:
    """Give a conversation's directory to ``identity`` (when the server runs as root), so that
    the block can write in it, and (``mode``) set its permissions, unless it has them already.
    Files the server writes into it stay the server's (readable)."""
    if identity is None:
        return
    try:
        info = os.stat(path, follow_symlinks=False)
        if (info.st_uid, info.st_gid) != (identity.uid, identity.gid):
            os.chown(path, identity.uid, identity.gid, follow_symlinks=False)
        if mode is not None and (not stat.S_ISDIR(info.st_mode) or stat.S_IMODE(info.st_mode) != mode):
            os.chmod(path, mode)
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
