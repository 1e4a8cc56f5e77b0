"""A zygote as the server sees it: the sandbox process that forks workers on request.

One ``python -m app.runtime.worker --zygote`` (inside bubblewrap for the ``bwrap`` backend) imports
the preloaded modules once; every worker is a fork of it, sharing its warm heap copy-on-write, so
a worker costs a fork and a few MiB instead of an interpreter (~90 MiB with numpy, pandas and
matplotlib). Workers of one zygote share its PID namespace: that is only safe when a block's
signals cannot leave its own processes (Landlock's signal scope, ABI 6), so without it a bwrap
zygote forks a single worker (``capacity``) and the pool starts one zygote per worker.

The server asks for a worker by sending ``C`` with one end of a fresh socketpair attached on the
zygote's control socket (SOCK_SEQPACKET, its stdin), and read-only descriptors on the worker's
cgroup counters when it has one; the zygote reports ``clone {pid}`` (in
request order) and ``gone {pid}`` once a worker exited, as frames on its stdout. Nothing a block
runs holds either descriptor (a worker keeps only its own channel), but the reports are checked
all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections import deque
from collections.abc import Sequence
from typing import Final

import structlog

from app.runtime import isolation
from app.runtime.protocol import FrameError
from app.runtime.worker_process import WorkerGone, WorkerProcess, read_frame_from

log = structlog.get_logger(__name__)

# A worker's frames: a snapshot, figures and a block's output may be large.
_STREAM_LIMIT: Final = 1 << 20
_SEND_TIMEOUT_SECONDS: Final = 5.0


class Zygote:
    """The server's handle on a zygote process: its control socket, its reports, its workers."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        control: socket.socket,
        *,
        namespaced: bool,
        capacity: int | None,
    ) -> None:
        self.proc = proc
        # bwrap: killing bubblewrap's own child (the namespace's init) ends every process of it.
        self.namespaced = namespaced
        self.capacity = capacity  # workers it may hold at once (None: no limit)
        self.workers: dict[int, WorkerProcess] = {}
        self.dead = False
        self._control = control
        self._control.settimeout(_SEND_TIMEOUT_SECONDS)
        self._asked: deque[asyncio.Future[int]] = deque()
        self._started: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._reports = asyncio.ensure_future(self._read_reports())

    async def started(self) -> bool:
        """Wait for the zygote's first report (sent before it imports anything): whether a block
        sees only its own processes, so that its workers may share its PID namespace.
        WorkerGone when it died first."""
        return await asyncio.shield(self._started)

    @property
    def full(self) -> bool:
        """Whether it may fork no further worker now."""
        held = len(self.workers) + len(self._asked)
        return self.dead or (self.capacity is not None and held >= self.capacity)

    async def clone(self, stats: Sequence[int] = ()) -> WorkerProcess:
        """A new worker forked by this zygote (not yet ready: ``await_ready`` says when its first
        child is). ``stats``: read-only descriptors on its cgroup's counters, passed on to it
        (the caller keeps and closes its own). WorkerGone when the zygote is gone."""
        if self.dead:
            raise WorkerGone("the sandbox zygote is gone")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            asked = asyncio.get_running_loop().create_future()
            self._asked.append(asked)
            try:
                socket.send_fds(self._control, [b"C"], [theirs.fileno(), *stats])
            except OSError as exc:
                self._asked.remove(asked)
                raise WorkerGone(f"the sandbox zygote does not take requests: {exc}") from None
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            pid = await asked
            reader, writer = await asyncio.open_unix_connection(sock=ours, limit=_STREAM_LIMIT)
        except BaseException:
            ours.close()
            raise
        worker = WorkerProcess(reader, writer, pid=pid, host=self)
        self.workers[pid] = worker
        return worker

    async def _read_reports(self) -> None:
        """Map the zygote's reports to the workers; at its end, every worker is gone too."""
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            header, _, _ = await read_frame_from(stdout, max_blob=0, max_header=256)
            hides = header.get("hides")
            if header.get("t") != "start" or not isinstance(hides, bool) or len(header) != 2:
                raise FrameError(f"a zygote that did not start as expected: {header}")
            self._started.set_result(hides)
            while True:
                header, _, _ = await read_frame_from(stdout, max_blob=0, max_header=256)
                pid = header.get("pid")
                if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or len(header) != 2:
                    raise FrameError(f"a malformed zygote report: {header}")
                if header.get("t") == "clone" and self._asked:
                    asked = self._asked.popleft()
                    if not asked.done():
                        asked.set_result(pid)
                elif header.get("t") == "gone":
                    worker = self.workers.pop(pid, None)
                    if worker is not None:
                        worker.dead = True
                        worker.exited.set()
                else:
                    raise FrameError(f"an unexpected zygote report: {header}")
        except (FrameError, ConnectionError) as exc:
            if not isinstance(exc, WorkerGone):
                log.warning("sandbox_zygote_misbehaved", reason=str(exc))
        finally:
            self._gone()

    def _gone(self) -> None:
        self.dead = True
        if not self._started.done():
            self._started.set_exception(WorkerGone("the sandbox zygote is gone"))
            self._started.exception()  # retrieved: nobody may be waiting for it
        for asked in self._asked:
            if not asked.done():
                asked.set_exception(WorkerGone("the sandbox zygote is gone"))
        self._asked.clear()
        for worker in self.workers.values():
            worker.dead = True
            worker.exited.set()
        self.workers.clear()

    def kill(self) -> None:
        """SIGKILL the zygote, its workers and everything they run.

        Its control socket is closed first: a sandbox that outlives the kill reads EOF and exits,
        so it cannot hold the report pipe open (asyncio's ``wait()`` waits for the pipes to close).
        """
        self.dead = True
        with contextlib.suppress(OSError):
            self._control.close()
        if self.proc.returncode is None:
            # bwrap: bubblewrap's own child is the namespace's init; killing it ends every process
            # of the namespace. Its parent-death signal alone is not enough: bubblewrap killed
            # just after it started can die before the child arms it (seen: 1 start in 40).
            targets = isolation.children(self.proc.pid) if self.namespaced else []
            if not self.namespaced:
                # process: the workers and what their blocks left running, below the zygote.
                isolation.kill_tree(self.proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            for pid in targets:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self._reports.cancel()
        self._gone()
