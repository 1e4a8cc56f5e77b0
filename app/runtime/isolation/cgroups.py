"""Per-worker cgroups, the server's side: the kernel bounds the memory (swap included) and the tasks
of a worker's whole process tree, which is the one block it runs, and counts its OOM kills and CPU
time. Made by the server, which started bubblewrap: a worker cannot see or write the host's cgroup
tree (no /sys in bwrap, Landlock for the process backend), so it can neither leave nor enlarge its
own. cgroup v1 (a hierarchy per controller) or v2 (one), detected when the pool starts; where the
host offers neither writable, ``open_cgroups`` raises ``CgroupsUnavailable`` saying why.

Layout: ``<the server's own cgroup>/sabre-<pidns>-<pid>-<start>-<n>/w<k>``, one directory per pool
(per controller under v1) holding one cgroup per worker. A pool directory whose server is gone (same
PID namespace, that pid no longer that process) is stale: its processes are killed and it is removed
when a pool starts. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from app.runtime.isolation.linux import write_file

DEFAULT_ROOT: Final = Path("/sys/fs/cgroup")
# Tasks of a worker itself in its cgroup (its main thread and its relay's watchdog), beside the
# block's ``max_processes``: the pids controller counts threads, as RLIMIT_NPROC does.
WORKER_TASKS: Final = 2
_REMOVE_SECONDS: Final = 5.0
_pool_numbers = itertools.count()


class CgroupsUnavailable(Exception):
    """No writable cgroup with the memory and pids controllers here: blocks keep their per-process
    limits only."""


@dataclass(eq=False)
class WorkerCgroup:
    """One worker's cgroup: its directory under each controller (v2: the same one), the limits last
    written, and the OOM kills counted when its current block started."""

    name: str
    memory: Path
    pids: Path
    cpu: Path | None
    version: Literal[1, 2]
    limits: tuple[int, int] | None = None
    oom_before: int = 0
    oom_at_removal: int | None = None  # its last count, read as it was removed
    # Its OOM counter file, opened on the first read and read again with pread (the server reads
    # it for every block: a few microseconds where opening it anew costs about fifteen).
    _oom_fd: int | None = field(default=None, repr=False)
    # ``remove`` runs in a thread, and may run in two at once: a removal whose awaiting was
    # cancelled goes on in its thread while the pool's close removes the cgroup again.
    _removing: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def dirs(self) -> list[Path]:
        """Its distinct directories, one per hierarchy."""
        return list(dict.fromkeys(d for d in (self.memory, self.pids, self.cpu) if d is not None))

    def place(self, pid: int) -> None:
        """Move process ``pid`` (a host pid, all its threads) into this cgroup."""
        for directory in self.dirs:
            write_file(directory / "cgroup.procs", str(pid))

    def set_limits(self, *, memory_bytes: int, tasks: int) -> None:
        """Bound the tree's memory (swap: none beyond it) and tasks; a no-op when unchanged.
        OSError when the kernel refuses (v1: EBUSY, more in use than the new limit)."""
        if self.limits == (memory_bytes, tasks):
            return
        self.limits = None  # until written through
        if self.version == 1:
            limit, memsw = self.memory / "memory.limit_in_bytes", self.memory / "memory.memsw.limit_in_bytes"
            # memory+swap may never be set below memory: raise it first, lower it last.
            order = [memsw, limit] if memory_bytes > int(_read(limit)) else [limit, memsw]
            for path in order:
                if path.exists():
                    write_file(path, str(memory_bytes))
        else:
            write_file(self.memory / "memory.max", str(memory_bytes))
            if (self.memory / "memory.swap.max").exists():
                write_file(self.memory / "memory.swap.max", "0")
        write_file(self.pids / "pids.max", str(tasks))
        self.limits = (memory_bytes, tasks)

    def memory_limit(self) -> int:
        """The memory limit in force, in bytes (what a test checks a block could not change)."""
        name = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
        text = _read(self.memory / name).strip()
        return -1 if text == "max" else int(text)

    def oom_kills(self) -> int:
        """Processes of the tree the kernel's OOM killer killed since the cgroup was made."""
        if self.oom_at_removal is not None:
            return self.oom_at_removal
        if self._oom_fd is None:
            name = "memory.oom_control" if self.version == 1 else "memory.events"
            self._oom_fd = os.open(self.memory / name, os.O_RDONLY | os.O_CLOEXEC)
        return oom_kills_in(os.pread(self._oom_fd, 4096, 0).decode())

    def peak_bytes(self) -> int | None:
        """The most memory the tree has held at once (None where the kernel does not say)."""
        path = self.memory / ("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")
        try:
            return int(_read(path))
        except (OSError, ValueError):
            return None

    def stat_fds(self) -> list[int]:
        """Read-only descriptors on its OOM counter and its CPU time, for the worker (which reads
        them with ``cgroup_meter``; it cannot open them itself)."""
        oom = self.memory / ("memory.oom_control" if self.version == 1 else "memory.events")
        cpu = None if self.cpu is None else self.cpu / ("cpuacct.usage" if self.version == 1 else "cpu.stat")
        fds = [os.open(oom, os.O_RDONLY | os.O_CLOEXEC)]
        if cpu is not None:
            fds.append(os.open(cpu, os.O_RDONLY | os.O_CLOEXEC))
        return fds

    def kill_all(self) -> None:
        """SIGKILL every process left in it (through a pidfd, once it is known to be still here)."""
        if self.version == 2 and (self.memory / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                write_file(self.memory / "cgroup.kill", "1")
            return
        _kill_members(self.pids)

    def remove(self) -> bool:
        """Kill what is left in it and remove its directories; False while some remain."""
        with self._removing:  # its descriptor is closed once, never a number reused meanwhile
            self.kill_all()
            if self.oom_at_removal is None:
                with contextlib.suppress(OSError):
                    self.oom_at_removal = self.oom_kills()
            if self._oom_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._oom_fd)
                self._oom_fd = None
            if not _procs(self.memory):
                self._uncharge()
            return all(_rmdir(d) for d in self.dirs)

    def _uncharge(self) -> None:
        """Reclaim what is still charged to it, once no process is left (the page cache of the
        files its blocks wrote): a removed memory cgroup that still has pages charged stays in
        the kernel, dying, until they are reclaimed, and the kernel holds at most 65,535 of them
        at once: a block that had its worker retired again and again would use them all up, and
        then no memory cgroup could be made on the host (ENOSPC), this pool's included."""
        with contextlib.suppress(OSError):
            if self.version == 1:
                write_file(self.memory / "memory.force_empty", "0")
            elif (self.memory / "memory.reclaim").exists():
                write_file(self.memory / "memory.reclaim", _read(self.memory / "memory.current").strip())


def oom_kills_in(text: str) -> int:
    """The ``oom_kill`` count of a v1 ``memory.oom_control`` or a v2 ``memory.events``."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


@dataclass(eq=False)
class Cgroups:
    """A pool's cgroups: its directory under each controller, and the worker cgroups it made."""

    version: Literal[1, 2]
    memory: Path
    pids: Path
    cpu: Path | None
    workers: set[WorkerCgroup] = field(default_factory=set)
    _numbers: itertools.count[int] = field(default_factory=itertools.count)

    def describe(self) -> str:
        """What is in force, for the start-up log and the probe."""
        return f"cgroup v{self.version} per worker under {self.memory}"

    def create(self) -> WorkerCgroup:
        """A new, empty worker cgroup (no limits until its first block)."""
        name = f"w{next(self._numbers)}"
        dirs = {p: p / name for p in dict.fromkeys(d for d in (self.memory, self.pids, self.cpu) if d)}
        made: list[Path] = []
        try:
            for path in dirs.values():
                path.mkdir(mode=0o755)
                made.append(path)
        except OSError:
            for path in made:
                _rmdir(path)
            raise
        cgroup = WorkerCgroup(
            name=name,
            memory=dirs[self.memory],
            pids=dirs[self.pids],
            cpu=None if self.cpu is None else dirs[self.cpu],
            version=self.version,
        )
        self.workers.add(cgroup)
        return cgroup

    async def remove(self, cgroup: WorkerCgroup) -> None:
        """Remove a worker's cgroup once its processes are gone (killing any left). It stays the
        pool's until it is gone: a removal that failed, or whose awaiting was cancelled (the pool
        closing while a retired worker's cgroup goes), is made again by ``close``. Forgotten, it
        kept the pool's own directories from going, and ``close`` waited on them for 15 s."""
        if cgroup not in self.workers:
            return
        if not await _removed(cgroup.remove):
            raise OSError(errno.EBUSY, f"the sandbox cgroup {cgroup.memory} could not be removed")
        self.workers.discard(cgroup)

    async def close(self) -> None:
        """Remove every worker cgroup left, then the pool's own directories."""
        for cgroup in list(self.workers):
            with contextlib.suppress(OSError):
                await self.remove(cgroup)
        for path in dict.fromkeys(d for d in (self.memory, self.pids, self.cpu) if d):
            await _removed(functools.partial(_rmdir, path))


def open_cgroups(root: Path = DEFAULT_ROOT, *, cgroup_file: str = "/proc/self/cgroup") -> Cgroups:
    """This pool's cgroups under the server's own (v2 when it offers memory and pids, else v1),
    stale pool directories of dead servers removed first. CgroupsUnavailable saying why not."""
    own = _own_cgroups(cgroup_file)
    unified = root if (root / "cgroup.controllers").exists() else root / "unified"
    if "" in own and _has_controllers(unified / own[""].lstrip("/"), ("memory", "pids")):
        return _open_v2(unified / own[""].lstrip("/"))
    parents: dict[str, Path] = {}
    for controller in ("memory", "pids", "cpuacct"):
        mount = next(
            (m for m in (root / controller, root / "cpu,cpuacct") if (m / "cgroup.procs").exists()), None
        )
        if controller in own and mount is not None and controller in mount.name.split(","):
            parents[controller] = mount / own[controller].lstrip("/")
    missing = [c for c in ("memory", "pids") if c not in parents]
    if missing:
        raise CgroupsUnavailable(
            f"no cgroup v2 with the memory and pids controllers, nor cgroup v1 {' and '.join(missing)} "
            f"hierarchies, under {root}"
        )
    name = _pool_name()
    made: dict[str, Path] = {}
    try:
        for controller, parent in parents.items():
            _clean_stale(parent)
            made[controller] = _make_pool_dir(parent / name)
    except OSError as exc:
        for path in made.values():
            _rmdir(path)
        raise CgroupsUnavailable(f"cannot create cgroups under {root}: {exc}") from None
    return Cgroups(version=1, memory=made["memory"], pids=made["pids"], cpu=made.get("cpuacct"))


def _open_v2(base: Path) -> Cgroups:
    """v2: the pool's directory under ``base``, with memory and pids enabled for its workers. A
    cgroup that holds processes gives its children no controllers: when the server is alone in
    ``base`` it moves itself into a leaf of it (``sabre-server``) first."""
    try:
        _clean_stale(base)
        try:
            _enable(base)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            if _procs(base) != [os.getpid()]:
                raise CgroupsUnavailable(
                    f"cgroup v2: {base} holds other processes than this server, so its children "
                    "cannot have the memory controller; run the server in a cgroup of its own"
                ) from None
            leaf = base / "sabre-server"
            leaf.mkdir(mode=0o755, exist_ok=True)
            write_file(leaf / "cgroup.procs", str(os.getpid()))
            _enable(base)
        pool = _make_pool_dir(base / _pool_name())
        try:
            _enable(pool)
        except OSError:
            _rmdir(pool)
            raise
    except OSError as exc:
        raise CgroupsUnavailable(f"cannot create cgroups under {base}: {exc}") from None
    return Cgroups(version=2, memory=pool, pids=pool, cpu=pool)


def _enable(path: Path) -> None:
    """v2: let the children of ``path`` have the memory and pids controllers."""
    if not {"memory", "pids"} <= set(_read(path / "cgroup.subtree_control").split()):
        write_file(path / "cgroup.subtree_control", "+memory +pids")


def _has_controllers(path: Path, wanted: tuple[str, ...]) -> bool:
    try:
        return set(wanted) <= set(_read(path / "cgroup.controllers").split())
    except OSError:
        return False


def _own_cgroups(cgroup_file: str) -> dict[str, str]:
    """The server's cgroup per controller (``""``: the v2 one), from /proc/self/cgroup."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError), open(cgroup_file) as listing:
        for line in listing:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


def _make_pool_dir(path: Path) -> Path:
    """Create a pool's directory; OSError unless the kernel made it a cgroup (its control files)."""
    path.mkdir(mode=0o755)
    if not (path / "cgroup.procs").exists():
        _rmdir(path)
        raise OSError(errno.ENOTSUP, f"{path.parent} is not a cgroup file system")
    return path


def _pool_name() -> str:
    """``sabre-<pid namespace>-<pid>-<start time>-<n>``: unique, and says whose it is."""
    return f"sabre-{_pid_namespace()}-{os.getpid()}-{_start_time(os.getpid())}-{next(_pool_numbers)}"


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rpartition(b")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _clean_stale(parent: Path) -> None:
    """Remove the pool directories under ``parent`` whose server (in this PID namespace) is gone,
    killing what is left in them (a server killed with SIGKILL leaves them behind)."""
    namespace = _pid_namespace()
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            parts = entry.name.split("-")
            if len(parts) != 5 or parts[0] != "sabre" or not all(p.isdigit() for p in parts[1:]):
                continue
            ns, pid, start = int(parts[1]), int(parts[2]), int(parts[3])
            if ns != namespace or _start_time(pid) == start:
                continue
            deadline = time.monotonic() + _REMOVE_SECONDS
            while not _remove_tree(entry) and time.monotonic() < deadline:
                time.sleep(0.05)


def _remove_tree(path: Path) -> bool:
    """Kill the processes of ``path`` and its descendants and remove them all; False if some stay."""
    removed = True
    with contextlib.suppress(OSError):
        for child in path.iterdir():
            if child.is_dir():
                removed = _remove_tree(child) and removed
    _kill_members(path)
    return _rmdir(path) and removed


def _kill_members(cgroup: Path) -> None:
    """SIGKILL every process in ``cgroup`` through a pidfd, once it is known to be still there: a
    pid read from cgroup.procs may belong to another process by the time it is signalled (the
    member exited and its pid was reused), but not while a pidfd holds it."""
    for pid in _procs(cgroup):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if pid in _procs(cgroup):  # not a reused pid: still a member, now pinned
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)


async def _removed(attempt: Callable[[], bool]) -> bool:
    """Call ``attempt`` (whether it is done) until it is, for a few seconds at most; in a thread:
    reclaiming what is charged to a cgroup (``WorkerCgroup._uncharge``) may write back pages."""
    # Here, not at the top: sandbox workers import this module (through ``cgroup_meter``) and load
    # no asyncio (with ssl, logging, concurrent.futures: a sixth of their heap and start-up).
    import asyncio

    deadline = time.monotonic() + _REMOVE_SECONDS
    while True:
        if await asyncio.to_thread(attempt):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)


def _procs(path: Path) -> list[int]:
    try:
        return [int(p) for p in _read(path / "cgroup.procs").split()]
    except (OSError, ValueError):
        return []


def _rmdir(path: Path) -> bool:
    """Remove an (empty of processes) cgroup directory; True when it is gone."""
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _read(path: Path) -> str:
    with open(path) as handle:
        return handle.read()
