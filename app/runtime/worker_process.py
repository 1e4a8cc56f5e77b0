"""A sandbox worker process as the server sees it: its pipes, framed reads and writes, its kill.

The worker itself (``app.runtime.worker``) runs inside the sandbox; this is the server's handle
on it, used by the pool (lifecycle) and by an exchange (one block's frames).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

from app.runtime import isolation
from app.runtime.frames import ReadyFrame
from app.runtime.protocol import MAX_HEADER_BYTES, PREFIX, FrameError, decode_header, decode_prefix


class WorkerGone(FrameError):
    """The worker's pipe closed: it died (or was killed), whatever its block was doing."""


def worker_env() -> dict[str, str]:
    """The whole environment of a worker and its children: built from scratch, no secrets.

    HOME is set per block (to its workdir); PYTHONHASHSEED is fixed so that set iteration
    order, and with it the order of calls, is the same when a block is replayed. Numerical libraries
    run single-threaded: a block has one CPU budget for all its threads, and a thread pool that
    numpy's OpenBLAS started would keep the block's process from staying live for its next block.
    """
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "MPLBACKEND": "Agg",
        **dict.fromkeys(_THREAD_POOL_VARIABLES, "1"),
    }


# Thread-pool sizes of OpenBLAS (numpy's), OpenMP, MKL and the libraries that read them.
_THREAD_POOL_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


class WorkerState(StrEnum):
    """Where a worker is in its life, as the pool sees it (``RuntimePool`` moves it along)."""

    STARTING = "starting"  # its process starts and forks its first child
    IDLE = "idle"  # its child waits for a block
    RUNNING = "running"  # its child runs a block
    BOUND = "bound"  # its child belongs to one conversation: parked in a block, or live between blocks
    REARMING = "rearming"  # its last child ends and the next is forked: free in a few milliseconds
    RETIRED = "retired"  # killed (crashed, misbehaved, or the pool closed); a replacement starts


class WorkerProcess:
    """A worker process, the pid of its current child, and its state."""

    def __init__(self, proc: asyncio.subprocess.Process, *, namespaced: bool = False) -> None:
        self.proc = proc
        # bwrap: the worker reports pids of its own PID namespace, meaningless (and dangerous
        # to signal) here; killing bubblewrap takes the whole namespace down instead.
        self.namespaced = namespaced
        self.child_pid: int | None = None
        self.state = WorkerState.STARTING
        self.dead = False
        self.last_header_bytes = 0  # of the last frame read (the journal's size is capped)
        assert proc.stdin is not None
        assert proc.stdout is not None
        self._stdin = proc.stdin
        self._stdout = proc.stdout

    async def read(
        self, *, max_blob: int, max_header: int = MAX_HEADER_BYTES
    ) -> tuple[dict[str, Any], bytes]:
        """Read one frame; FrameError if it is malformed or too large."""
        try:
            prefix = await self._stdout.readexactly(PREFIX.size)
            header_len, blob_len = decode_prefix(prefix, max_header=max_header, max_blob=max_blob)
            data = await self._stdout.readexactly(header_len + blob_len)
        except asyncio.IncompleteReadError:
            raise WorkerGone("the sandbox worker closed its pipe (it died)") from None
        self.last_header_bytes = header_len
        return decode_header(data[:header_len]), data[header_len:]

    async def send(self, data: bytes) -> None:
        """Write one frame; FrameError if the worker is gone."""
        try:
            self._stdin.write(data)
            await self._stdin.drain()
        except (ConnectionError, RuntimeError) as exc:  # RuntimeError: the transport is closed
            raise WorkerGone(f"the sandbox worker closed its pipe (it died): {exc}") from None

    def kill(self) -> None:
        """SIGKILL the child's process group (the code and what it started) and the worker.

        Its stdin is closed first: a sandbox that outlives the kill reads EOF and exits, so it
        cannot hold the stdout pipe open (asyncio's ``wait()`` waits for the pipes to close).
        """
        self.dead = True
        with contextlib.suppress(Exception):
            self._stdin.close()
        if self.proc.returncode is not None:
            return  # reaped already: its pid (and the child's, gone with it) may be reused
        # bwrap: bubblewrap's own child is the namespace's init; killing it ends every process
        # of the namespace. Its parent-death signal alone is not enough: bubblewrap killed
        # just after it started can die before the child arms it (seen: 1 start in 40).
        targets = isolation.children(self.proc.pid) if self.namespaced else []
        if not self.namespaced:
            # process: what the blocks left running (the worker is their subreaper) goes first.
            isolation.kill_tree(self.proc.pid)
        for pgid in (None if self.namespaced else self.child_pid, self.proc.pid):
            if pgid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    async def await_ready(self) -> None:
        header, _ = await self.read(max_blob=0)
        self.child_pid = ReadyFrame.model_validate(header).pid
