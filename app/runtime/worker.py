"""A sandbox worker: ``python -m app.runtime.worker --preload numpy,pandas``.

It imports the heavy modules once, then forks one child at a time ahead of demand: the child
waits for its block on the worker's stdin and talks to the parent over the worker's stdin/stdout
(see ``app.runtime.protocol``); the worker reaps it, kills whatever the code left running in its
process group, reports how it ended (an ``exit`` frame) and forks the next. Every block runs in a
fresh fork, so nothing leaks from one block (or conversation) to the next.

With ``--isolation bwrap`` the worker runs inside bubblewrap and each child narrows its own view
to its block's directory (``app.runtime.isolation``); after each child the worker also kills
whatever else runs in its PID namespace.

Started by ``RuntimePool`` with a clean environment; never imports pydantic or asyncio, to keep
an idle worker small.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Sequence

from app.runtime import isolation, sandbox
from app.runtime.protocol import EXIT_EOF, write_frame


def _protocol_fds() -> tuple[int, int]:
    """Move the protocol pipes off fds 0/1; point 0 at /dev/null and 1 at stderr.

    So a module that prints at import time writes to the log, not into the protocol.
    """
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return proto_in, proto_out


def _kill_group(pgid: int) -> None:
    """Kill what the code left running in the child's process group (it may be empty)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _serve(*, proto_in: int, proto_out: int, log_fd: int) -> int:
    """Fork, wait and report, one child after another, until the parent goes away."""
    while True:
        # Objects of the warm heap are never collected: the GC then leaves their pages
        # shared with the children instead of touching (copying) them.
        gc.collect()
        gc.freeze()
        sys.stdout.flush()  # a child must not inherit (and later flush) the worker's output
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                isolation.after_fork()  # still single-threaded: its own namespaces, while idle
                code = sandbox.serve_one(proto_in=proto_in, proto_out=proto_out, private_fds=(log_fd,))
            except BaseException:
                # fd 2 of the child is the block's output capture; runtime bugs go to the log
                # (which is closed once the block's code may run: then the exit code tells).
                with contextlib.suppress(OSError):
                    os.write(log_fd, traceback.format_exc().encode(errors="replace"))
            finally:
                os._exit(code)
        _, status, usage = os.wait4(pid, 0)
        _kill_group(pid)
        isolation.reap_leftovers()
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_EOF:
            return 0
        report = {
            "t": "exit",
            "pid": pid,
            "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
        }
        try:
            write_frame(proto_out, report)
        except BrokenPipeError:
            return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: preload modules, then serve children forever."""
    parser = argparse.ArgumentParser(prog="python -m app.runtime.worker")
    parser.add_argument("--preload", default="", help="comma-separated modules to import")
    parser.add_argument("--isolation", choices=("bwrap", "process"), default="process")
    parser.add_argument("--workspaces", default=None, help="the workspaces directory (bwrap)")
    parser.add_argument("--identity", default=None, help="uid:gid blocks run as (server is root)")
    options = parser.parse_args(argv)
    proto_in, proto_out = _protocol_fds()
    log_fd = os.dup(2)
    # First: a worker started as root switches user here (which also clears the parent-death
    # signal, so that is set after it).
    isolation.configure_worker(
        options.isolation,
        workspaces=options.workspaces,
        identity=isolation.Identity.parse(options.identity) if options.identity else None,
    )
    sandbox.die_with_parent()
    # matplotlib picks its config and cache directory once, at import: this worker's own (its
    # home may not exist, e.g. nobody's); blocks get the environment without it.
    config = tempfile.mkdtemp(prefix="matplotlib-")
    os.chmod(config, 0o755)  # readable by blocks that run as another user (process, as root)
    os.environ["MPLCONFIGDIR"] = config
    for name in filter(None, options.preload.split(",")):
        importlib.import_module(name)
    del os.environ["MPLCONFIGDIR"]
    sandbox.warm_up()
    return _serve(proto_in=proto_in, proto_out=proto_out, log_fd=log_fd)


if __name__ == "__main__":
    sys.exit(main())
