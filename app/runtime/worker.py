"""A sandbox zygote and its workers: ``python -m app.runtime.worker --zygote --preload numpy,pandas``.

The zygote imports the heavy modules once, then forks workers on the server's request
(``_zygote``); each worker shares its warm heap and talks to the server over a socket of its own.
A worker (``_serve``) forks one child at a time ahead of demand; each child gets a socket of its
own to the worker and an output pipe, and nothing else: the worker relays and checks what the
child sends (``app.runtime.relay``), learns of its death from the kernel, kills whatever the code
left running (its process group, and every process below the worker: orphans are re-parented to
it, their subreaper), reports how it ended (an ``exit`` frame) and forks the next. A
conversation's first block runs in a fresh fork; its later ones may run in the same child while
the pool keeps it live for that conversation (never another one), so nothing leaks from one
conversation to the next. Without ``--zygote`` the process is a single worker on its
stdin/stdout.

With ``--isolation bwrap`` the zygote runs inside bubblewrap and each child narrows its own view
to its block's directory (``app.runtime.isolation``).

Started by ``RuntimePool`` with a clean environment; never imports pydantic or asyncio, to keep
an idle worker small."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import gc
import importlib
import io
import os
import select
import signal
import socket
import sys
import tempfile
import traceback
from collections.abc import Sequence
from typing import Final

from app.runtime import isolation
from app.runtime.child.main import serve_one, warm_up
from app.runtime.child.process import die_with_parent
from app.runtime.protocol import write_frame
from app.runtime.relay import ChildLink, ServerClosed, Violation

# The descriptors of a child: 0 /dev/null, 1 and 2 its output pipe, then these.
CHANNEL_FD: Final = 3
LOG_FD: Final = 4
_PR_SET_CHILD_SUBREAPER: Final = 36
# A child that dies or misbehaves before it is ready this many times in a row: the worker stops.
_MAX_FAILED_STARTS: Final = 5
# How often a zygote looks again for orphans while its last look found some (a tree forking as
# it is killed); otherwise it sleeps until the server asks for a worker or a worker exits.
_ZYGOTE_TICK_MS: Final = 200


def _protocol_fds() -> tuple[int, int, int]:
    """The server's pipes and the log, moved off 0/1/2 (0 becomes /dev/null, 1 the log, so a
    module that prints at import time writes to the log, not into the protocol), and every
    other descriptor the worker inherited closed: the server's process may leave some open
    (its log file, a namespace handle, whatever its own parent passed down)."""
    proto_in, proto_out, log = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3) for fd in (0, 1, 2))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    _close_fds_but(proto_in, proto_out, log)
    return proto_in, proto_out, log


def _close_fds_but(*keep: int) -> None:
    """Close every descriptor from 3 up but ``keep``."""
    kept = sorted(set(keep))
    for low, high in zip([3, *(fd + 1 for fd in kept)], [*kept, 1 << 20], strict=True):
        if low < high:
            os.closerange(low, high)


def _arrange_child_fds(*, channel: int, output: int, log: int) -> None:
    """In a fresh child: 0 /dev/null, 1 and 2 the output pipe, ``CHANNEL_FD`` its socket,
    ``LOG_FD`` the log; every other descriptor (the worker's pipes to the server included)
    closed. The channel and the log do not survive an exec of the code's programs."""
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 16) for fd in (channel, output, log)]
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(moved[1], 1)
    os.dup2(moved[1], 2)
    os.dup2(moved[0], CHANNEL_FD, inheritable=False)
    os.dup2(moved[2], LOG_FD, inheritable=False)
    os.closerange(LOG_FD + 1, 1 << 20)


def _reap_descendants() -> None:
    """Kill and reap every process still below the worker: what the block left running, its
    daemons included (orphans are re-parented to the worker, their subreaper)."""
    for _ in range(10_000):
        children = isolation.children(os.getpid())
        if not children:
            return
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _log(log_fd: int, message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(log_fd, f"sandbox worker {os.getpid()}: {message}\n".encode(errors="replace"))


def _fork_child(log_fd: int) -> tuple[int, int, int]:
    """Fork the next child with its own channel and output pipe: (pid, channel, output)."""
    # Objects of the warm heap are never collected: the GC then leaves their pages shared
    # with the children instead of touching (copying) them.
    gc.collect()
    gc.freeze()
    sys.stdout.flush()  # a child must not inherit (and later flush) the worker's output
    sys.stderr.flush()
    isolation.check_worker_namespaces()  # before the child's channel, a socket of the namespace
    ours, theirs = (s.detach() for s in socket.socketpair())
    output_read, output_write = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _arrange_child_fds(channel=theirs, output=output_write, log=log_fd)
            isolation.after_fork()  # still single-threaded: its own namespaces, while idle
            code = serve_one(channel=CHANNEL_FD, log_fd=LOG_FD)
        except BaseException:
            # Runtime bugs go to the log (closed once the block's code may run: then the exit
            # code tells).
            with contextlib.suppress(OSError):
                os.write(LOG_FD, traceback.format_exc().encode(errors="replace"))
        finally:
            os._exit(code)
    os.close(theirs)
    os.close(output_write)
    return pid, ours, output_read


def _serve(*, proto_in: int, proto_out: int, log_fd: int, meter: isolation.CgroupMeter | None = None) -> int:
    """Fork, relay and report, one child after another, until the server goes away. ``meter``:
    the worker's cgroup, whose OOM kills and CPU time bound each block's whole process tree."""
    server = io.FileIO(proto_in, "rb", closefd=False)
    failed_starts = 0
    stale_owed = False  # a block came for a live child that had died: say so once ready
    while True:
        pid, channel, output = _fork_child(log_fd)
        child = ChildLink(
            pid=pid, channel=channel, output=output, server_in=server, server_out=proto_out, meter=meter
        )
        try:
            if not child.wait_ready():
                child.kill()
                failed_starts += 1
                _log(log_fd, f"child {pid} failed before it was ready")
                if failed_starts >= _MAX_FAILED_STARTS:
                    return 1
                continue
            failed_starts = 0
            write_frame(proto_out, {"t": "ready", "pid": pid})
            if stale_owed:
                write_frame(proto_out, {"t": "stale"})
                stale_owed = False
            child.wait_run()
            ended = child.relay()
        except ServerClosed:
            child.kill()
            return 0
        except Violation as exc:
            child.kill()
            _log(log_fd, str(exc))
            return 1
        except BrokenPipeError:
            child.kill()
            return 0
        finally:
            child.close()
            _cleanup(pid)
        stale_owed = child.stale_owed
        try:
            write_frame(proto_out, ended.frame(pid))
        except BrokenPipeError:
            return 0


def _cleanup(pid: int) -> None:
    """After a child: nothing it started may outlive it. Its process group first, then every
    process left below this worker: orphans of the block (a daemon in a session of its own
    included) are re-parented to the worker, their subreaper, so the worker's own tree holds
    all of them, and nothing else (``kill -1`` would also reach processes beside the worker)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    isolation.kill_tree(os.getpid(), wait_seconds=1.0)
    _reap_descendants()
    isolation.remove_block_tmp(pid)


def _zygote(*, control: int, reports: int, log_fd: int) -> int:
    """Fork workers on the server's request until it closes ``control``; they share this
    process's warm heap (copy-on-write), so one costs a fork, not an interpreter.

    ``control`` is a SOCK_SEQPACKET socket: each message is ``C`` with a descriptor attached,
    a connected stream socket that becomes the new worker's channel to the server (its frames
    are those of a worker on its stdin/stdout), then those of its cgroup's counters, if any.
    ``reports`` gets a ``clone`` frame (its pid) per worker forked, in request order, and a
    ``gone`` frame once it exited and was reaped.
    Processes left below this one that are not workers (orphans of a worker that died: they come
    to this subreaper) are killed, when a worker exits and again every ``_ZYGOTE_TICK_MS`` while
    any are found; between such events it sleeps (a pidfd per worker says when one exits). The
    server closing ``control``: every worker and what it runs is killed, then exit.
    """
    channel = socket.socket(fileno=control)
    poller = select.poll()
    poller.register(control, select.POLLIN)
    gc.collect()
    gc.freeze()  # the warm heap: never collected here, so its pages stay shared with every fork
    workers: set[int] = set()
    exits: dict[int, int] = {}  # a pidfd per worker: readable once it exited
    unwatched: set[int] = set()  # workers without one (none could be opened): looked for on a tick
    orphans = False
    while True:
        for fd, _ in poller.poll(_ZYGOTE_TICK_MS if orphans or unwatched else None):
            if fd in exits:  # that worker exited: reaped below, its orphans swept
                poller.unregister(fd)
                os.close(fd)
                del exits[fd]
                continue
            try:
                message, fds, _, _ = socket.recv_fds(channel, 16, 3)
            except OSError as exc:
                _log(log_fd, f"zygote: control socket failed: {exc}")
                message, fds = b"", []
            if not message:
                isolation.kill_tree(os.getpid(), wait_seconds=1.0)
                _reap_descendants()
                return 0
            if message != b"C" or not fds:
                for fd in fds:
                    os.close(fd)
                _log(log_fd, f"zygote: bad control message {message[:16]!r} with {len(fds)} fds")
                return 1
            pid = _fork_worker(fds[0], stats=fds[1:], control=control, reports=reports, log_fd=log_fd)
            for fd in fds:
                os.close(fd)
            workers.add(pid)
            try:
                exited = os.pidfd_open(pid)
            except OSError as exc:  # out of descriptors: its exit is found on a tick instead
                _log(log_fd, f"zygote: no pidfd for worker {pid}: {exc}")
                unwatched.add(pid)
            else:
                exits[exited] = pid
                poller.register(exited, select.POLLIN)
            write_frame(reports, {"t": "clone", "pid": pid})
        orphans = False
        for pid in isolation.children(os.getpid()):
            if pid not in workers:  # an orphan of a worker that died: nothing may outlive it
                orphans = True
                isolation.kill_tree(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while True:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                if pid in workers:
                    workers.discard(pid)
                    unwatched.discard(pid)
                    write_frame(reports, {"t": "gone", "pid": pid})


def _fork_worker(channel: int, *, stats: Sequence[int], control: int, reports: int, log_fd: int) -> int:
    """Fork a worker whose channel to the server is ``channel`` (both ways); ``stats``: read-only
    descriptors on its cgroup's counters (``isolation.CgroupMeter``), when the server made one."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        fd = fcntl.fcntl(channel, fcntl.F_DUPFD_CLOEXEC, 3)
        kept = [fcntl.fcntl(stat, fcntl.F_DUPFD_CLOEXEC, 3) for stat in stats]
        for inherited in (channel, control, reports, *stats):
            os.close(inherited)
        _close_fds_but(fd, log_fd, *kept)  # the zygote's control socket and report pipe above all
        isolation.worker_namespaces()  # bwrap: its children's network and IPC namespaces
        # Orphans of its blocks come to it, not to the zygote, and it dies with the zygote.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        die_with_parent()
        meter = isolation.CgroupMeter(kept) if kept else None
        code = _serve(proto_in=fd, proto_out=fd, log_fd=log_fd, meter=meter)
    except BaseException:
        with contextlib.suppress(OSError):
            os.write(log_fd, traceback.format_exc().encode(errors="replace"))
    finally:
        os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: preload modules, then serve children forever."""
    parser = argparse.ArgumentParser(prog="python -m app.runtime.worker")
    parser.add_argument("--preload", default="", help="comma-separated modules to import")
    parser.add_argument("--isolation", choices=("bwrap", "process"), default="process")
    parser.add_argument("--workspaces", default=None, help="the workspaces directory (bwrap)")
    parser.add_argument("--identity", default=None, help="uid:gid blocks run as (server is root)")
    parser.add_argument(
        "--zygote", action="store_true", help="fork workers on request (stdin: a SOCK_SEQPACKET socket)"
    )
    options = parser.parse_args(argv)
    # A signal mask is inherited through fork and exec: one the server's spawning thread had (a
    # library's thread that blocks signals, a test) would hold, in every block, the signals its
    # limits arrive by (SIGXCPU, the wall clock's SIGALRM) and those its code expects.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    proto_in, proto_out, log_fd = _protocol_fds()
    # Orphans of a block (a daemon that left its session) become the worker's children, so
    # the worker can kill them when the block ends.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # First: a worker started as root switches user here (which also clears the parent-death
    # signal, so that is set after it).
    isolation.configure_worker(
        options.isolation,
        workspaces=options.workspaces,
        identity=isolation.Identity.parse(options.identity) if options.identity else None,
    )
    die_with_parent()
    if options.zygote:  # first of its reports: whether its workers may share its PID namespace
        write_frame(proto_out, {"t": "start", "hides": isolation.hides_processes()})
    # matplotlib picks its config and cache directory once, at import: this worker's own (its
    # home may not exist, e.g. nobody's); blocks get the environment without it.
    config = tempfile.mkdtemp(prefix="matplotlib-")
    os.chmod(config, 0o755)  # readable by blocks that run as another user (process, as root)
    os.environ["MPLCONFIGDIR"] = config
    isolation.allow_reading(config)  # process: matplotlib reads its cache there later too
    for name in filter(None, options.preload.split(",")):
        importlib.import_module(name)
    del os.environ["MPLCONFIGDIR"]
    warm_up()
    if options.zygote:
        return _zygote(control=proto_in, reports=proto_out, log_fd=log_fd)
    return _serve(proto_in=proto_in, proto_out=proto_out, log_fd=log_fd)


if __name__ == "__main__":
    sys.exit(main())
