"""Disk quota of a conversation's working directory: bytes and files, measured by the worker.

The workspaces share one filesystem, on which no kernel quota can be had without privileges, so
the worker (never the block) walks the block's working directory: when the block starts (its
baseline; for the next block of a live process, when the last one ended, before the next can
write), every ``QUOTA_INTERVAL_SECONDS`` while it runs, and before its ``done`` is relayed.
A block that takes the directory past a quota, and past where it started, is killed and ends
as ``limit: disk`` or ``disk_files``; one that starts over quota may still delete files. What a
block writes between two measurements is bounded by the per-file size limit times what it can
create in that time; a later block pays for any excess before it runs long.

Imported by the sandbox worker: standard library only.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from typing import Literal

QuotaKind = Literal["disk", "disk_files"]


# A directory by handle only: no read right needed, no symbolic link followed.
_HANDLE = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def usage(paths: Sequence[str], *, stop_bytes: int = 0, stop_files: int = 0) -> tuple[int, int]:
    """(bytes allocated, entries) below ``paths``, symbolic links not followed; the walk stops
    early once either passes its ``stop_*`` (0: never). A directory the block made unreadable
    is opened up again (it is the block's own, and the worker's user owns it).

    The block runs while this walks, and may swap a directory it holds for a symbolic link at
    any moment: every step goes from a directory's descriptor to its child's by name without
    following links (``openat``, ``fstatat``), never through a path that is resolved again, so
    the walk (and a change of mode) never leaves the block's own tree."""
    total = files = 0
    stack: list[int] = []
    try:
        for path in paths:
            with contextlib.suppress(OSError):
                stack.append(os.open(path, _HANDLE))
        while stack:
            handle = stack.pop()
            try:
                entries = _entries(handle)
            finally:
                os.close(handle)
            for info, child in entries:
                files += 1
                if info is not None:
                    total += info.st_blocks * 512
                if child is not None:
                    stack.append(child)
            if (stop_bytes and total > stop_bytes) or (stop_files and files > stop_files):
                break
    finally:
        for handle in stack:
            os.close(handle)
    return total, files


def _entries(handle: int) -> list[tuple[os.stat_result | None, int | None]]:
    """The entries of the directory behind ``handle`` (an ``O_PATH`` descriptor): each one's
    status (None when it cannot be measured: counted, never hidden) and, for a directory, a
    handle on it (the caller closes it). Nothing when the directory cannot be read."""
    _open_up(handle)
    try:  # the very directory of the handle, opened for reading (".", no link followed)
        directory = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=handle)
    except OSError:
        return []
    found: list[tuple[os.stat_result | None, int | None]] = []
    try:
        with os.scandir(directory) as listing:
            for entry in listing:
                try:
                    info: os.stat_result | None = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted meanwhile
                except OSError:
                    info = None
                child = None
                if info is not None and stat.S_ISDIR(info.st_mode):
                    with contextlib.suppress(OSError):  # ELOOP: a link now, not descended
                        child = os.open(entry.name, _HANDLE, dir_fd=directory)
                found.append((info, child))
    except OSError:
        pass
    finally:
        os.close(directory)
    return found


def _open_up(handle: int) -> None:
    """Give the owner (the worker's user: the block's files are its own) read and search
    rights on a directory the block closed, so nothing in it escapes the measurement: through
    its handle, so the change lands on that very directory whatever its name points to now."""
    with contextlib.suppress(OSError):
        mode = os.fstat(handle).st_mode
        if stat.S_ISDIR(mode) and mode & 0o700 != 0o700:
            os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(mode) | 0o700)


class Quota:
    """The quotas of one block's directories (its working directory; the process backend's
    private TMPDIR), against their usage when the block started."""

    def __init__(
        self, paths: Sequence[str], *, max_bytes: int, max_files: int, start: tuple[int, int] | None = None
    ) -> None:
        self.paths = paths
        self._max_bytes = max_bytes
        self._max_files = max_files
        # (bytes, entries) when the block started: given when measured before it (a live
        # process's next block, measured at the end of the last one), else measured by ``begin``.
        self._start = start
        # The last whole measurement that found the directory within its quotas.
        self.last: tuple[int, int] | None = None

    def begin(self) -> None:
        """Measure the baseline now, unless it was given."""
        if self._start is None:
            self._start = self.last = usage(self.paths)

    def exceeded(self) -> QuotaKind | None:
        """Which quota the directory is past now (and past its baseline), if any. The first
        call measures the baseline."""
        if self._start is None:
            self._start = self.last = usage(self.paths)
            return None
        start_bytes, start_files = self._start
        used, count = usage(
            self.paths,
            stop_bytes=max(self._max_bytes, start_bytes),
            stop_files=max(self._max_files, start_files),
        )
        if self._max_bytes and used > max(self._max_bytes, start_bytes):
            return "disk"
        if self._max_files and count > max(self._max_files, start_files):
            return "disk_files"
        # Within both: the walk stopped at neither cap, so it counted everything.
        self.last = (used, count)
        return None
