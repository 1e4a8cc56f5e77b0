"""A sandbox worker process as the server sees it: its channel, framed reads and writes, its stop.

The worker itself (``app.runtime.worker``) runs inside the sandbox, forked by a zygote
(``app.runtime.zygote``); this is the server's handle on it, used by the pool (lifecycle) and by
an exchange (one block's frames).
"""

from __future__ import annotations

import asyncio
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.runtime.frames import ReadyFrame
from app.runtime.protocol import MAX_HEADER_BYTES, PREFIX, FrameError, decode_header, decode_prefix

if TYPE_CHECKING:
    from app.runtime.isolation import WorkerCgroup
    from app.runtime.zygote import Zygote


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
    """Where a worker is in its life, as the pool sees it (``WorkerSupervisor.set_state`` moves it)."""

    STARTING = "starting"  # its process starts and forks its first child
    IDLE = "idle"  # its child waits for a block
    RUNNING = "running"  # its child runs a block
    BOUND = "bound"  # its child belongs to one conversation: parked in a block, or live between blocks
    REARMING = "rearming"  # its last child ends and the next is forked: free in a few milliseconds
    RETIRED = "retired"  # killed (crashed, misbehaved, or the pool closed); a replacement starts


async def read_frame_from(
    reader: asyncio.StreamReader, *, max_blob: int, max_header: int
) -> tuple[dict[str, Any], bytes, int]:
    """One frame from a sandbox process: header, blob and the header's size. FrameError if it
    is malformed or too large, WorkerGone when the stream ends."""
    try:
        prefix = await reader.readexactly(PREFIX.size)
        header_len, blob_len = decode_prefix(prefix, max_header=max_header, max_blob=max_blob)
        data = await reader.readexactly(header_len + blob_len)
    except (asyncio.IncompleteReadError, ConnectionError):
        raise WorkerGone("the sandbox worker closed its pipe (it died)") from None
    return decode_header(data[:header_len]), data[header_len:], header_len


class WorkerProcess:
    """A worker as the server sees it: its channel (one stream socket, both ways), the pid of its
    current child, and its state. Forked by a zygote (``app.runtime.zygote``), which reports its
    exit; ``pid`` is its pid in the sandbox (under bwrap, of the sandbox's PID namespace: an
    identifier, never signalled from here)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, pid: int, host: Zygote
    ) -> None:
        self.pid = pid
        self.host = host
        self.child_pid: int | None = None
        self.state = WorkerState.STARTING
        self.dead = False
        self.exited = asyncio.Event()  # its zygote reaped it (or the zygote itself is gone)
        self.last_header_bytes = 0  # of the last frame read (the journal's size is capped)
        self.idle_since = 0.0  # when it last became idle (the pool lets surplus idle ones go)
        self.cgroup: WorkerCgroup | None = None  # its own, when the host allows (``isolation.cgroups``)
        self.tenant = ""  # whose block it runs or last ran (the supervisor shares workers by tenant)
        self._reader = reader
        self._writer = writer

    @property
    def alive(self) -> bool:
        """Not killed, not reported gone, and its channel not closed (a worker that died just now
        is known by its channel first: its zygote's report may still be on the way)."""
        return not self.dead and not self._reader.at_eof()

    async def read(
        self, *, max_blob: int, max_header: int = MAX_HEADER_BYTES
    ) -> tuple[dict[str, Any], bytes]:
        """Read one frame; FrameError if it is malformed or too large."""
        header, blob, self.last_header_bytes = await read_frame_from(
            self._reader, max_blob=max_blob, max_header=max_header
        )
        return header, blob

    async def send(self, data: bytes) -> None:
        """Write one frame; FrameError if the worker is gone."""
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:  # RuntimeError: the transport is closed
            raise WorkerGone(f"the sandbox worker closed its pipe (it died): {exc}") from None

    def kill(self) -> None:
        """Stop the worker: its channel is cut, so it kills its child (and what the block
        started) at once and exits. The pool takes its whole zygote down if it does not."""
        self.dead = True
        self._writer.transport.abort()

    async def await_ready(self) -> None:
        header, _ = await self.read(max_blob=0)
        self.child_pid = ReadyFrame.model_validate(header).pid
