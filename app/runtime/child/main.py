"""The child's life: the worker's one warm-up (a dry block through the whole path, before any
fork) and a forked child's loop (ready, one block, report; or live, the next block)."""

from __future__ import annotations

import gc
import io
import mmap
import os
import signal
import sys
import types
from typing import Any, Final

from app.runtime import library, snapshot
from app.runtime.child import running
from app.runtime.child.block import Block, DryRunStopped, LiveState
from app.runtime.child.output import OutputStream
from app.runtime.child.process import die_with_parent
from app.runtime.protocol import (
    EXIT_EOF,
    LIVE_MAX_BLOCKS,
    PREFIX,
    RunRequest,
    WireLimits,
    as_run_request,
    call_digest,
    decode_header,
    encode_frame,
    read_frame,
    run_request,
    write_frame,
)

# Address space unmapped on MemoryError so that reporting the limit does not run out too
# (RLIMIT_AS counts mappings, so an untouched mapping reserves room without using memory).
_RESERVE_BYTES: Final = 16 << 20


def _on_limit_signal(signum: int, frame: types.FrameType | None) -> None:
    """SIGXCPU (RLIMIT_CPU) or SIGALRM (the wall clock): the running block ends itself.

    So its output is kept and the worker survives; the parent kills the child only when this
    cannot run (code stuck in C, handlers replaced by the code).
    """
    if running.current is not None:
        running.current.on_limit("cpu_time" if signum == signal.SIGXCPU else "wall_clock")


_WARM_UP_CODE: Final = """\
def f(x):
    return x + 1
y = f(a)
z = tool(y, mode="x")
files = FS.list_files()
print(y, z, files)
result({"y": y, "z": z})
1 / 0
"""


def _warm_up_values() -> dict[str, Any]:
    """Values for the dry block's snapshot: a function (cloudpickle's by-value path) and plain
    data. Not numpy or pandas objects: pickling them faults in pages every child would then pay
    for (~4 ms of CPU per block, a fifth of a trivial block's whole cost), while only the blocks
    that keep such values need them, and those pay it themselves."""
    return {"a": 1, "g": lambda: 1, "s": {"k": [1.5, "x", None]}}


_LIMITS: Final = WireLimits(
    cpu_seconds=10,
    memory_mb=2048,
    wall_clock_seconds=30,
    max_processes=64,
    file_size_mb=100,
    open_files=256,
    stdout_bytes=32_000,
    snapshot_bytes=1 << 20,
    disk_mb=1024,
    disk_files=10_000,
)


def warm_up() -> None:
    """Run a dry block through the real code path (journal-answered call, snapshot load and
    dump, traceback, report encoding) once in the worker, before it forks, so no block pays the
    first-use costs (lazy imports and caches). Not all of it again in each child: that would
    also pay its copy-on-write faults ahead of the block (~0.3 ms of start latency saved) at
    ~1.3 ms of CPU per block; each child rehearses the common path only (``rehearse``)."""
    library.warm()
    digest = call_digest(name="tool", args=[2], kwargs={"mode": "x"})
    listed = call_digest(name="FS.list_files", args=[], kwargs={})
    request = run_request(
        code=_WARM_UP_CODE,
        workdir=os.getcwd(),
        limits=_LIMITS,
        helpers=["helper"],
        tools={"tool": ["x", "mode"]},
        journal=[["tool", digest, 3], ["FS.list_files", listed, ["a.txt"]]],
    )
    data, _ = snapshot.dump(_warm_up_values(), skip=frozenset(), helpers={}, max_bytes=1 << 20)
    _dry_block(request, data)
    gc.collect()


def rehearse() -> None:
    """In a fresh child, before it says ready: a dry trivial block through the path every block
    takes (its request decoded, the block set up, compiled, run, snapshot, report encoded), so
    the copy-on-write faults of the pages that path touches are paid while the child waits, not
    once its block came. Nothing of a conversation is in the child yet, and the dry block leaves
    the process as it found it (``_dry_block``)."""
    _dry_block(run_request(code="x = 1\n", workdir=os.getcwd(), limits=_LIMITS), b"")


def _dry_block(request: RunRequest, snapshot_data: bytes) -> None:
    """Run ``request`` as a dry block (nothing sent, no limit or directory of its own), then put
    back what a block changes in its process: output streams, HOME, working directory, the
    running block and the sandbox helpers' binding."""
    output = OutputStream(None)
    saved = sys.stdout, sys.stderr, os.environ.get("HOME"), os.getcwd()
    sys.stdout = sys.stderr = output
    # Through the wire format, as a real request comes (its decoding warms up too).
    request = as_run_request(decode_header(encode_frame(request)[PREFIX.size :]))
    block = Block(request=request, output=output, channel_in=None, channel_out=-1, reserve=None, dry=True)
    try:
        block.start()
        block.run(snapshot_data)
    except DryRunStopped:
        pass
    running.block = None
    library.bind(None)
    sys.stdout, sys.stderr, home, cwd = saved
    if home is None:
        os.environ.pop("HOME", None)
    else:
        os.environ["HOME"] = home
    os.chdir(cwd)


def serve_one(*, channel: int, log_fd: int) -> int:
    """Life of one forked child: prepare, say ready, run one block, report. Returns exit code.

    The worker arranged the descriptors before this runs (``app.runtime.worker``): 0 is
    /dev/null, 1 and 2 the output pipe only the worker reads, ``channel`` this child's own
    socket to the worker (nothing of the worker's pipes to the server survives the fork), and
    ``log_fd`` the worker's log, for runtime bugs until the request arrives and closed before
    the block's code runs. Nothing the block sends reaches the server unchecked: the worker
    reads the channel, validates and caps every frame, and speaks for the child's life itself.
    """
    os.setsid()  # its own process group: killing the group kills what the code started
    die_with_parent()
    # Python ignores SIGXFSZ (writes past RLIMIT_FSIZE then fail with EFBIG); the default
    # action ends the block and the parent reports it as file_size.
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    signal.signal(signal.SIGXCPU, _on_limit_signal)
    signal.signal(signal.SIGALRM, _on_limit_signal)
    output = OutputStream(1)
    sys.stdout = sys.stderr = output
    reserve = mmap.mmap(-1, _RESERVE_BYTES)
    stream = io.FileIO(channel, "rb", closefd=False)
    rehearse()
    write_frame(channel, {"t": "ready"})
    try:
        header, snapshot_data = read_frame(stream)
    except EOFError:
        return EXIT_EOF
    request = as_run_request(header)
    os.close(log_fd)
    live: LiveState | None = None
    for _ in range(LIVE_MAX_BLOCKS):
        block = Block(
            request=request, output=output, channel_in=stream, channel_out=channel, reserve=reserve, live=live
        )
        block.start()
        if live is not None:
            live.resume_signals()
        live = block.run(snapshot_data)
        if live is None:
            return 0
        # Live: this process belongs to the conversation; only its next block, or the word to
        # stop, may come (the worker checks both before passing them on).
        try:
            header, snapshot_data = read_frame(stream)
        except EOFError:
            return 0
        if header.get("t") == "release":
            return 0
        request = as_run_request(header)
        if not request.get("live") or request["workdir"] != live.workdir or snapshot_data:
            raise RuntimeError("sandbox protocol: a live process got a request that is not its next block")
    return 0
