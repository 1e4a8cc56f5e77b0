"""The worker's side of one sandbox child: it alone speaks to the server for the child.

A child holds nothing of the worker's pipes to the server: it talks over a socket of its own,
which the worker reads, checks and relays. Everything the child sends is hostile input:

- a frame is read with size caps (the header by the block's output limit, a blob only on
  ``done`` and only as large as a snapshot and its figures may be), must be JSON with a tag the
  protocol allows at that point (``ready`` once while idle; then ``call``, ``record``, ``done``),
  and the block's totals are capped (calls, journal records and their bytes);
- lifecycle frames come from the worker only: the child's death is learnt from the kernel (a
  pidfd, then ``wait4``), never from the child, and ``exit`` is written once it is reaped;
- after ``done`` nothing more may come: anything on the channel then is a violation;
- a child the server asked to ``keep`` may stay live after a clean ``done``: it belongs to its
  conversation, says nothing while live (anything it sends is a violation), and gets only the
  next block of the same directory or ``release``; what its block left running is killed at the
  ``done``, as if it had exited, and each block's CPU time is checked by the worker (the hard
  RLIMIT_CPU of a live process spans several blocks);
- what the block printed is read by the worker from the output pipe (``app.runtime.output``)
  and put in the ``done`` it relays: the block cannot forge or rewrite it.

A violation kills the child's process group at once; the ``exit`` frame then names it, and the
server logs it and fails the block. The server's replies are relayed only to the child they
were meant for: a reply that arrives after its child ended is dropped.

Imported by the sandbox worker: standard library only.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Final, Literal

from app.runtime import isolation, quota
from app.runtime.output import Output
from app.runtime.protocol import (
    MAX_CALLS,
    MAX_FIGURE_BYTES,
    MAX_FIGURES,
    MAX_HEADER_BYTES,
    MAX_JOURNAL_BYTES,
    MAX_RECORDS,
    PREFIX,
    FrameError,
    decode_header,
    decode_prefix,
    encode_frame,
    read_exact,
    read_frame_bytes,
    write_all,
)

# How often the worker measures the block's disk use while it runs (and once at its end).
QUOTA_INTERVAL_SECONDS: Final = 0.05
# A frame is written in one go: a child that stalls in the middle of one (or does not take a
# reply it asked for) this long is hostile, and must not hold the worker (nor its quota checks).
STALL_SECONDS: Final = 1.0
# After its ``done`` a child exits at once: past this it is killed, whatever it does.
DONE_GRACE_SECONDS: Final = 0.5
_IDLE_MAX_HEADER: Final = 1024
_TIMEVAL: Final = struct.pack("ll", int(STALL_SECONDS), int(STALL_SECONDS % 1 * 1e6))


_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
_PAGE_KB: Final = os.sysconf("SC_PAGE_SIZE") // 1024


class _ProcFile:
    """A /proc file of the child, opened once while it is idle (runtime code, dumpable) and read
    again with pread: a few microseconds where opening it anew costs about ten, and still
    readable after the block makes its process non-dumpable, which hides it from a new open
    under bwrap's ``hidepid`` /proc. The descriptor is this very process's, never a reused pid's."""

    __slots__ = ("_fd", "_path")

    def __init__(self, path: str) -> None:
        self._path = path
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = -1  # read by its path each time, as a fallback

    def read(self) -> bytes:
        """The file's whole text now (OSError once the process is gone)."""
        if self._fd >= 0:
            return os.pread(self._fd, 4096, 0)
        with open(self._path, "rb") as handle:
            return handle.read()

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def _pids(children: _ProcFile | None) -> list[int]:
    """The pids a ``/proc/<pid>/task/<tid>/children`` lists (none when it cannot be read)."""
    if children is None:
        return []
    try:
        return [int(pid) for pid in children.read().split()]
    except (OSError, ValueError):
        return []


def _cpu_seconds(stat: _ProcFile | None) -> float:
    """CPU time used so far by the process of ``/proc/<pid>/stat`` (all its threads; 0 when it
    is gone)."""
    if stat is None:
        return 0.0
    try:
        fields = stat.read().rpartition(b")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def _resident_kb(statm: _ProcFile | None) -> int:
    """Resident memory of the process of ``/proc/<pid>/statm`` in KiB (0 when it is gone):
    statm, a few microseconds, where smaps_rollup walks the page tables (half a millisecond)."""
    if statm is None:
        return 0
    try:
        return int(statm.read().split()[1]) * _PAGE_KB
    except (OSError, IndexError, ValueError):
        return 0


class ServerClosed(Exception):
    """The server closed the worker's request pipe: the pool is closing."""


class Violation(Exception):
    """The child sent what the protocol does not allow: it is killed."""


@dataclass(frozen=True, slots=True)
class Ended:
    """How a child ended, as the kernel (and the worker) saw it."""

    code: int | None
    signal: int | None
    cpu_seconds: float
    violation: str | None = None
    limit: Literal["disk", "disk_files", "cpu_time", "memory"] | None = None
    live: bool = False  # it died live, between blocks

    def frame(self, pid: int) -> dict[str, Any]:
        """The ``exit`` frame the worker writes for it."""
        return {
            "t": "exit",
            "pid": pid,
            "code": self.code,
            "signal": self.signal,
            "cpu_seconds": self.cpu_seconds,
            "violation": self.violation,
            "limit": self.limit,
            "live": self.live,
        }


class ChildLink:
    """One forked child as the worker sees it: its channel, its output pipe, its pidfd."""

    def __init__(
        self,
        *,
        pid: int,
        channel: int,
        output: int,
        server_in: io.FileIO,
        server_out: int,
        meter: isolation.CgroupMeter | None = None,
    ) -> None:
        self.pid = pid
        # The worker's cgroup (None: blocks are limited per process only): OOM kills and CPU
        # time of the block's whole tree, counted from the block's start.
        self._meter = meter
        self._tree_oom_base = 0
        self._tree_cpu_base: float | None = None
        self._channel = channel
        # Reads and writes on the channel give up after STALL_SECONDS (the poll loop only
        # enters one when the child has begun a frame, or asked for the reply).
        with socket.socket(fileno=os.dup(channel)) as handle:
            for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
                handle.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL)
        self._channel_in = io.FileIO(channel, "rb", closefd=False)
        self._output_fd = output
        os.set_blocking(output, False)
        self._pidfd = os.pidfd_open(pid)
        self._server_in = server_in
        self._server_out = server_out
        self._output = Output()
        self._phase: Literal["idle", "running", "done", "live"] = "idle"
        self._keep = False  # the server asked that the child stay live after this block
        # A block for this live child came after it died: the server is owed a ``stale``.
        self.stale_owed = False
        self._workdir: str | None = None
        self._cpu_base = 0.0  # the child's CPU time when its current block started
        self._resident_base = 0  # KiB resident when it was ready (``wait_ready``)
        self._cpu_budget = 0.0
        self._channel_open = True
        self._dead = False
        self._violation: str | None = None
        self._limit: Literal["disk", "disk_files", "cpu_time", "memory"] | None = None
        self._calls = 0
        self._records = 0
        self._record_bytes = 0
        self._max_header = _IDLE_MAX_HEADER
        self._max_blob = 0
        self._quota: quota.Quota | None = None
        self._quota_lock = threading.Lock()
        # A live child's directory as its last block left it: its next block's disk baseline.
        self._next_disk_start: tuple[int, int] | None = None
        # Its /proc stat and statm, its children and the worker's (the block's orphans come to
        # the worker), opened once it is ready (``wait_ready``).
        self._stat: _ProcFile | None = None
        self._statm: _ProcFile | None = None
        self._children: _ProcFile | None = None
        self._adopted: _ProcFile | None = None
        # The quota watchdog (``relay``): started once the child is ready, stopped when it is gone.
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        # Set while a block runs (``_start``, under the quota lock); the watchdog clears it, under
        # that lock, once it finds none running, and sleeps on it: no wake-ups between blocks.
        self._running = threading.Event()

    def close(self) -> None:
        """Stop the watchdog and release the worker's descriptors of this child (after it is
        reaped): the worker forks its next child with no other thread running."""
        self.stop_watchdog()
        for fd in (self._channel, self._output_fd, self._pidfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        for proc in (self._stat, self._statm, self._children, self._adopted):
            if proc is not None:
                proc.close()

    # Idle --------------------------------------------------------------------------------

    def wait_ready(self) -> bool:
        """Wait for the child's ``ready``: False when it died or said anything else first."""
        poller = select.poll()
        for fd in (self._channel, self._pidfd, self._output_fd):
            poller.register(fd, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._output_fd in ready and not self._output.drain(self._output_fd):
                poller.unregister(self._output_fd)
            if self._channel in ready:
                try:
                    header, _ = self._read_child()
                except (Violation, FrameError, EOFError):
                    return False
                if header.get("t") != "ready" or len(header) != 1:
                    return False
                # Ready, it is dumpable (its /proc files can be opened) and runs nothing of a block.
                self._stat = _ProcFile(f"/proc/{self.pid}/stat")
                self._statm = _ProcFile(f"/proc/{self.pid}/statm")
                self._children = _ProcFile(f"/proc/{self.pid}/task/{self.pid}/children")
                worker = os.getpid()
                self._adopted = _ProcFile(f"/proc/{worker}/task/{worker}/children")
                # What it holds when it starts is the worker's heap, shared copy-on-write (a write
                # to a shared page leaves the count as it is): what it grows by is its own.
                self._resident_base = _resident_kb(self._statm)
                self._take_baselines()
                return True
            if self._pidfd in ready:
                return False

    def _take_baselines(self) -> None:
        """What the next block's CPU time and OOM kills count from: the child's own CPU time and
        its worker's cgroup counters, taken while it waits for its block (idle, or live between
        two blocks), off the request path. Each only grows, so a block is charged as much as from
        its start or a little more (the runtime's own work until then), never less."""
        self._cpu_base = _cpu_seconds(self._stat)
        if self._meter is not None:
            self._tree_oom_base = self._meter.oom_kills()
            self._tree_cpu_base = self._meter.cpu_seconds()
        if self._phase == "live" and self._quota is not None:
            # Its next block comes for the same directory: as the block's end measured it (what
            # the block left running was killed after that: anything it wrote since counts for
            # the next block), before the next one can write, not once it runs.
            self._next_disk_start = self._quota.last or quota.usage(self._quota.paths)

    def wait_run(self) -> dict[str, Any]:
        """Wait for the server's ``run`` (dropping replies meant for an earlier child), pass it
        on as it came, and return its header; ServerClosed when the server closes the pipe,
        Violation when the idle child speaks or dies (the worker then stops: the server
        replaces it)."""
        self._start_watchdog()
        poller = select.poll()
        for fd in (self._server_in.fileno(), self._channel, self._pidfd):
            poller.register(fd, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if ready & {self._channel, self._pidfd}:
                raise Violation("the idle child spoke or died before its block")
            header, frame, _ = self._read_server()
            if header["t"] in ("reply", "release"):
                continue  # for an earlier child, which stopped before it got there
            if header["t"] == "run" and header.get("live"):
                # The next block of a live child that died in between: this child is fresh and
                # has none of its state. The server learns it and sends the block afresh.
                self._to_server(encode_frame({"t": "stale"}))
                continue
            if header["t"] != "run":
                raise RuntimeError(f"sandbox protocol: the server sent {header['t']!r} to an idle worker")
            limits = header["limits"]
            if self._next_disk_start is None and (limits.get("disk_mb") or limits.get("disk_files")):
                # A fresh block's disk baseline before it gets its code: measured once it runs, what
                # it writes first would never count (a few MB past the quota per fresh block).
                self._next_disk_start = quota.usage(self._quota_paths(header))
            # The block, then its bookkeeping while it starts: the worker reads nothing of the
            # child before ``relay``, and the baselines were taken before or while it was idle.
            try:
                self._to_child(frame)
            except OSError as exc:
                raise Violation(f"the child does not take its block: {exc}") from None
            self._start(header)
            return header

    def _quota_paths(self, request: dict[str, Any]) -> list[str]:
        """What a block's disk quota counts: its directory, and under the process backend its
        private TMPDIR (on disk too)."""
        private = [isolation.block_tmp(self.pid)] if isolation.backend() == "process" else []
        return [str(request["workdir"]), *private]

    def _start(self, request: dict[str, Any]) -> None:
        """The worker's side of a block it has passed on: its caps, its output, its quota."""
        limits = request["limits"]
        with self._quota_lock:  # the watchdog of a live child sees the block whole, or not yet
            if limits.get("disk_mb") or limits.get("disk_files"):
                self._quota = quota.Quota(
                    self._quota_paths(request),
                    max_bytes=int(limits.get("disk_mb") or 0) << 20,
                    max_files=int(limits.get("disk_files") or 0),
                    start=self._next_disk_start,
                )
                self._quota.begin()  # the baseline, if none was measured before the block
            else:
                self._quota = None
            self._next_disk_start = None
            self._keep = request.get("keep") is True
            self._workdir = str(request["workdir"])
            self._calls = self._records = 0
            self._record_bytes = int(request["journal_bytes"])  # the replay counts (measured by the server)
            self._output = Output(int(limits["stdout_bytes"]))
            # SIGXCPU comes at the block's limit, RLIMIT_CPU's hard limit a second later; the
            # worker kills a block of a process that may stay live (whose hard limit spans its
            # blocks) there.
            self._cpu_budget = float(limits["cpu_seconds"]) + 1
            # The same caps the server applies: stdout, results and the error are each capped in
            # the child (JSON may escape a byte into six); a call's arguments may be large alone.
            self._max_header = MAX_HEADER_BYTES + 20 * int(limits["stdout_bytes"])
            self._max_blob = int(limits["snapshot_bytes"]) + MAX_FIGURES * MAX_FIGURE_BYTES
            self._phase = "running"
            # The watchdog's first check comes an interval from now (the baseline is taken);
            # waking it costs the thread one timer re-arm, not a measurement beside the start.
            self._running.set()

    # Running -----------------------------------------------------------------------------

    def relay(self) -> Ended:
        """Relay between the server and the running child until the child is dead and reaped;
        ServerClosed if the server goes away first (the child is killed)."""
        poller = select.poll()
        server_fd = self._server_in.fileno()
        for fd in (server_fd, self._channel, self._output_fd, self._pidfd):
            poller.register(fd, select.POLLIN)
        if self._watchdog is None and (self._quota is not None or self._keep or self._meter is not None):
            self._start_watchdog()  # not started while it was idle (tests)
        try:
            return self._relay(poller, server_fd)
        finally:
            self.stop_watchdog()

    def _start_watchdog(self) -> threading.Thread:
        """Start the thread that measures the quotas on a timer of its own (a child that stalls
        a read or a write of the relay loop for up to STALL_SECONDS must not stop it). Started
        while the child is idle, off the request path; it measures while a block runs, on its
        own timer, and sleeps between blocks (``_watch_quota``)."""
        self._watchdog = threading.Thread(target=self._watch_quota, daemon=True)
        self._watchdog.start()
        return self._watchdog

    def stop_watchdog(self) -> None:
        """Stop the quota watchdog and wait until it has returned (at once if it never started).

        Under the quota lock, where the watchdog looks for the stop before it goes back to sleep:
        set outside it, the stop could come between that look and its sleep, and the watchdog
        slept for ever with the relay joining it (the worker hung, its block ended by the
        server's wall clock 30 s later; seen under load)."""
        with self._quota_lock:
            self._stop.set()
            self._running.set()  # a watchdog asleep between blocks wakes to stop
        if self._watchdog is not None:
            self._watchdog.join()

    def _watch_quota(self) -> None:
        """Every ``QUOTA_INTERVAL_SECONDS`` of a running block, its disk, CPU and tree checks.
        Between blocks (a ready child waiting for its block, a live one for its next) it sleeps
        until one starts: a worker per live conversation woke 20 times a second for nothing
        (16 live processes kept the sandbox at about 2% of a core with the server idle)."""
        stop, running = self._stop, self._running
        while True:
            running.wait()
            if stop.wait(QUOTA_INTERVAL_SECONDS):
                return
            with self._quota_lock:
                if stop.is_set():
                    return
                if self._phase != "running" or self._dead:
                    # Under the lock: a block that starts now, or a stop, sets it again.
                    running.clear()
                    continue
                if self._quota is not None:
                    self._check_quota()
                if self._keep and self._limit is None:
                    self._check_cpu()
                if self._meter is not None and self._limit is None:
                    self._check_tree()

    def _relay(self, poller: select.poll, server_fd: int) -> Ended:
        kill_at: float | None = None
        while not self._dead:
            now = time.monotonic()
            if self._phase == "done" and kill_at is None:
                kill_at = now + DONE_GRACE_SECONDS
            if kill_at is not None and now >= kill_at:
                self._kill()  # it reported and lingers: its outcome stands, its time is up
                kill_at = float("inf")
            wait = None if kill_at is None or kill_at == float("inf") else max(0.0, kill_at - now) * 1000
            events = poller.poll(wait)
            ready = {fd for fd, _ in events}
            if self._output_fd in ready and not self._output.drain(self._output_fd):
                poller.unregister(self._output_fd)
            if self._channel in ready:
                if self._phase in ("done", "live"):
                    if self._channel_closed():
                        self._channel_open = False  # it exited (or closed its end): as it should
                    else:
                        self._violate("a frame after the block's end")  # not even read
                else:
                    self._from_child()
                if not self._channel_open:
                    poller.unregister(self._channel)
            if server_fd in ready:
                self._from_server()
            if self._pidfd in ready:
                self._dead = True
        # Frames the child wrote before it died (its ``done``) may still be unread.
        while (
            self._channel_open and self._phase == "running" and select.select([self._channel], [], [], 0)[0]
        ):
            self._from_child()
        _, status, usage = os.wait4(self.pid, 0)
        if self._phase == "running" and self._quota is not None:
            with self._quota_lock:
                self._check_quota()
        if self._phase == "running" and self._limit is None and self._violation is None:
            self._check_tree()  # the OOM killer may have killed the block's own process
        return Ended(
            code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            # The block's own: a live process ran earlier blocks too.
            cpu_seconds=max(0.0, usage.ru_utime + usage.ru_stime - self._cpu_base),
            violation=self._violation,
            limit=self._limit,
            live=self._phase == "live",
        )

    def _channel_closed(self) -> bool:
        """Whether the child's end of the channel is closed (EOF), peeking at one byte at most."""
        with socket.socket(fileno=os.dup(self._channel)) as handle:
            try:
                return handle.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                return False
            except OSError:
                return True

    def _from_child(self) -> None:
        try:
            header, blob = self._read_child()
        except EOFError:
            self._channel_open = False
            return
        except (FrameError, Violation) as exc:
            self._violate(str(exc))
            return
        tag = header["t"]
        if self._phase != "running":
            self._violate(f"a {tag!r} frame after the block's end")
        elif tag == "call" and not blob:
            self._calls += 1
            if self._calls > MAX_CALLS:
                self._violate(f"more than {MAX_CALLS} calls")
            else:
                self._to_server(encode_frame(header))
        elif tag == "record" and not blob:
            size = len(encode_frame(header))
            self._records += 1
            self._record_bytes += size
            if self._records > MAX_RECORDS or self._record_bytes > MAX_JOURNAL_BYTES:
                self._violate(f"a journal beyond {MAX_RECORDS} records or {MAX_JOURNAL_BYTES} bytes")
            else:
                self._to_server(encode_frame(header))
        elif tag == "done":
            if self._quota is not None or self._meter is not None:
                with self._quota_lock:
                    if self._quota is not None:
                        self._check_quota()
                    if self._limit is None:
                        self._check_tree()  # a process of the block killed for its memory
                    if self._limit is None:
                        self._phase = "done"  # the watchdog measures no more
                if self._limit is not None:
                    return  # killed for its disk or memory use: the exit frame says so
            self._output.drain(self._output_fd)  # the child flushed before it reported
            header["stdout"] = self._output.text()
            live = header.get("live", False)
            if not isinstance(live, bool):
                self._violate("a done frame without a boolean 'live'")
                return
            live = live and self._keep and header.get("status") in ("ok", "error") and self._limit is None
            header["live"] = live
            # Measured here, never taken from the block: what the server weighs to keep it live.
            header["grown_kb"] = max(0, _resident_kb(self._statm) - self._resident_base) if live else 0
            if live:
                self._phase = "live"
                self._end_leftovers()
            else:
                self._phase = "done"
            self._to_server(encode_frame(header, blob))
            if live:
                self._take_baselines()  # for its next block, while the server reads this one
        else:
            self._violate(f"a {tag!r} frame{' with a blob' if blob else ''} from the block")

    def _from_server(self) -> None:
        header, frame, blob_len = self._read_server()
        tag = header["t"]
        if self._phase == "live" and tag in ("run", "release"):
            self._next_or_release(header, frame, blob_len)
            return
        if tag == "release":
            return  # the child ended before it got there
        if tag != "reply":
            raise RuntimeError(f"sandbox protocol: the server sent {tag!r} during a block")
        if self._phase == "running" and self._channel_open and self._violation is None:
            try:
                self._to_child(frame)
            except BlockingIOError:
                self._violate(f"the block did not take the reply it asked for in {STALL_SECONDS:g}s")
            except OSError:
                pass  # the child is going away; its exit frame follows

    def _next_or_release(self, header: dict[str, Any], frame: bytearray, blob_len: int) -> None:
        """A live child gets its conversation's next block (passed on as it came, then the
        worker's bookkeeping), or is told to stop."""
        if self._dead or select.select([self._pidfd], [], [], 0)[0]:
            self.stale_owed = header["t"] == "run"  # it died between blocks: not run
            return
        run = header["t"] == "run"
        if run:
            if (
                not header.get("live")
                or header.get("pid") != self.pid
                or header.get("workdir") != self._workdir
            ):
                raise RuntimeError("sandbox protocol: a block for a live child that is not its next one")
            if blob_len:
                raise RuntimeError("sandbox protocol: a live child's block comes without a snapshot")
        else:
            self._phase = "done"  # it exits now; the grace timer runs
        if self._channel_open and self._violation is None:
            try:
                self._to_child(frame)
            except BlockingIOError:
                self._violate(f"the live child did not take its request in {STALL_SECONDS:g}s")
            except OSError:
                pass  # it is going away; its exit frame follows
        if run:
            self._start(header)

    def _end_leftovers(self) -> None:
        """A block's end in a process that stays live: what the block started dies now, as it
        would with the process. Its descendants first (its own children listed through the
        descriptor opened when it was ready: /proc may hide a process that made itself
        non-dumpable from a new open); then the orphans that come to the worker, their
        subreaper, generation after generation until none is left: those of a process whose
        own children /proc hid come once it is dead. Usually both lists are empty at once."""
        children = self._children
        if children is None:
            isolation.kill_tree(self.pid, wait_seconds=1.0)
        elif _pids(children):
            isolation.kill_tree(self.pid, wait_seconds=1.0, read_children=lambda: _pids(children))
        for _ in range(10_000):
            adopted = _pids(self._adopted) if self._adopted is not None else isolation.children(os.getpid())
            orphans = [pid for pid in adopted if pid != self.pid]
            if not orphans:
                return
            for pid in orphans:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            for pid in orphans:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)

    def _check_cpu(self) -> None:
        if _cpu_seconds(self._stat) - self._cpu_base > self._cpu_budget:
            self._limit = "cpu_time"
            self._kill()

    def _check_tree(self) -> None:
        """The block's whole tree, by its worker's cgroup: an OOM kill in it (the cgroup's memory
        limit) ends the block as out of memory, and so does CPU time past the block's budget
        summed over its processes (RLIMIT_CPU binds each one alone)."""
        if self._meter is None:
            return
        if self._meter.oom_kills() > self._tree_oom_base:
            self._limit = "memory"
            self._kill()
            return
        used = self._meter.cpu_seconds()
        if (
            used is not None
            and self._tree_cpu_base is not None
            and used - self._tree_cpu_base > self._cpu_budget
        ):
            self._limit = "cpu_time"
            self._kill()

    def _check_quota(self) -> None:
        assert self._quota is not None
        over = self._quota.exceeded()
        if over is not None and self._limit is None:
            self._limit = over
            self._kill()

    # Frames ------------------------------------------------------------------------------

    def _read_child(self) -> tuple[dict[str, Any], bytes]:
        """One frame from the child, within the caps of the current phase; EOFError when the
        child closed its channel between frames."""
        try:
            prefix = self._channel_in.read(PREFIX.size) or b""
        except BlockingIOError:
            raise Violation("the block announced a frame and sent nothing") from None
        except OSError:
            prefix = b""
        if not prefix:
            raise EOFError
        try:
            if len(prefix) < PREFIX.size:
                prefix += read_exact(self._channel_in, PREFIX.size - len(prefix))
            header_len, blob_len = decode_prefix(prefix, max_header=self._max_header, max_blob=self._max_blob)
            header = decode_header(read_exact(self._channel_in, header_len))
            blob = read_exact(self._channel_in, blob_len) if blob_len else b""
        except EOFError:
            # (a read that timed out returns nothing, as at the end of the stream)
            raise Violation(
                f"the block's channel closed, or stalled for {STALL_SECONDS:g}s, in the middle of a frame"
            ) from None
        except BlockingIOError:
            raise Violation(f"the block stalled in the middle of a frame for {STALL_SECONDS:g}s") from None
        except OSError as exc:
            raise Violation(f"the block's channel failed in the middle of a frame: {exc}") from None
        return header, blob

    def _read_server(self) -> tuple[dict[str, Any], bytearray, int]:
        """A frame of the server: its header, its bytes (to pass on as they are), its blob's size."""
        try:
            return read_frame_bytes(self._server_in)
        except EOFError:
            raise ServerClosed from None

    def _to_child(self, data: bytes | bytearray) -> None:
        write_all(self._channel, data)

    def _to_server(self, data: bytes) -> None:
        write_all(self._server_out, data)

    def _violate(self, reason: str) -> None:
        if self._violation is None and self._limit is None:  # not the echo of a quota kill
            self._violation = reason
        self._channel_open = False
        self._kill()

    def _kill(self) -> None:
        """SIGKILL the child's process group (it is its own session leader) and the child. The
        child through its pidfd: the watchdog thread may kill just after the relay reaped it, and
        by then its pid may be another process's, never its pidfd (``close`` joins the watchdog
        before it closes the pidfd)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def kill(self) -> None:
        """Kill the child and reap it (the server went away)."""
        self._kill()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
