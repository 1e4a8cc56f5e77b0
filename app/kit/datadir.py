"""Owner-only modes for what SABRE keeps on disk: the data directory 0700, the SQLite store 0600.

The data directory holds the embedded store (conversations, hashed API keys, tool results) and
every conversation's files: nothing another local user may read. The sandbox still reaches the
workspaces inside it: bubblewrap binds them as root of its own user namespace, and the process
backend, as root, gives its blocks' identity a mount namespace in which the path is reachable
(``isolation.confine.make_reachable``); without root, blocks run as the owner.

SQLite creates its ``-wal``, ``-shm`` and ``-journal`` files with the database file's mode, so a
database created 0600 keeps them 0600; a store made by an older version is tightened here.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

import structlog

log = structlog.get_logger(__name__)

_SQLITE_SIBLINGS: Final = ("-wal", "-shm", "-journal")


def secure_data_dir(path: Path) -> None:
    """Create ``path`` 0700 (its missing parents too), or make it 0700 if group or others have
    any access to it (logged: the operator should know the store was readable)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        path.chmod(mode & 0o700)
        log.warning("data_dir_tightened", path=str(path), was=oct(mode), now=oct(mode & 0o700))


def secure_sqlite_file(database: Path) -> None:
    """Create the SQLite database file 0600 before SQLite opens it, and make it and the
    ``-wal``/``-shm``/``-journal`` files present 0600.

    A missing parent directory is created 0700; an existing one is left as it is (a path set in
    ``SABRE_DATABASE_URL`` may live in a directory that others share on purpose).
    """
    if not database.parent.exists():
        database.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # FileExistsError: an existing store, or another server process made it just now.
    with contextlib.suppress(FileExistsError):
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    for candidate in [database, *(database.with_name(database.name + s) for s in _SQLITE_SIBLINGS)]:
        try:
            if stat.S_IMODE(candidate.stat().st_mode) & 0o077:
                candidate.chmod(0o600)
        except FileNotFoundError:
            pass
