"""What a worker reads of its own cgroup: the OOM kills and the CPU time of its whole process tree
(the block it runs, every process of it), through read-only descriptors the server opened for it
(``cgroups.WorkerCgroup.stat_fds``): inside the sandbox there is no cgroup file system to open.
Standard library only."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from app.runtime.isolation.cgroups import oom_kills_in


class CgroupMeter:
    """Reads the worker's cgroup counters; ``fds``: the OOM counter file, then (optionally) the
    CPU time file (v1 ``cpuacct.usage`` in ns, or v2 ``cpu.stat``)."""

    def __init__(self, fds: Sequence[int]) -> None:
        self._oom_fd = fds[0]
        self._cpu_fd = fds[1] if len(fds) > 1 else None

    def oom_kills(self) -> int:
        """Processes of the tree the OOM killer killed so far (the cgroup's memory limit)."""
        return oom_kills_in(_pread(self._oom_fd))

    def cpu_seconds(self) -> float | None:
        """CPU time the whole tree used so far (None when the server gave no CPU counter)."""
        if self._cpu_fd is None:
            return None
        text = _pread(self._cpu_fd)
        first = text.split(maxsplit=1)[0] if text.strip() else "0"
        if first.isdigit():
            return int(first) / 1e9  # v1 cpuacct.usage: nanoseconds
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return None

    def close(self) -> None:
        for fd in (self._oom_fd, self._cpu_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _pread(fd: int) -> str:
    """The whole of a cgroup file from its start (the kernel renders it afresh at offset 0)."""
    return os.pread(fd, 4096, 0).decode()
