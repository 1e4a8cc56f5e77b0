"""The start-up probe: ``python -m app.runtime.isolation.probe --probe DIR --workspaces ROOT`` runs the
whole bwrap set-up once inside bubblewrap (a worker's, a child's, entering a directory and
writing there) and says why it fails, if it does. ``--limits`` (on the host, as the server's user)
says instead how blocks' memory and processes would be bounded here: per block (a cgroup per
worker) or per process only, and why."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from app.runtime.isolation.cgroups import DEFAULT_ROOT, CgroupsUnavailable, open_cgroups
from app.runtime.isolation.confine import after_fork, configure_worker, enter, hides_processes
from app.runtime.isolation.identity import Identity
from app.runtime.isolation.linux import capability_sets


def probe(workdir: str, *, workspaces: str, identity: Identity | None) -> None:
    """Run the whole bwrap set-up once (``python -m app.runtime.isolation.probe --probe DIR``): the
    worker's, a child's, entering ``workdir`` and writing a file there; raises if any step fails."""
    configure_worker("bwrap", workspaces=workspaces, identity=identity)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_fd)
            after_fork()
            enter(workdir, {"file_size_mb": 1, "memory_mb": 64})
            if capability_sets().get("CapEff", 1):
                raise RuntimeError("capabilities left after entering the work directory")
            if hides_processes() and os.path.exists(f"/proc/{os.getppid()}"):
                raise RuntimeError("a block's /proc shows processes outside the block")
            with open("probe.txt", "w") as out:
                out.write("ok")
            os.unlink("probe.txt")
            code = 0
        except BaseException as exc:
            traceback.print_exc()
            os.write(write_fd, f"{type(exc).__name__}: {exc}".encode(errors="replace"))
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        why = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        raise RuntimeError(why or f"the probe's child failed (wait status {status})")


def block_limits(cgroup_root: Path) -> str:
    """How a pool started here would bound blocks: it makes (and removes) a pool's cgroups."""
    try:
        cgroups = open_cgroups(cgroup_root)
    except CgroupsUnavailable as exc:
        return f"per process only ({exc})"
    asyncio.run(cgroups.close())
    return f"per block ({cgroups.describe()})"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m app.runtime.isolation.probe --probe DIR --workspaces ROOT [--identity U:G]``, or
    ``--limits [--cgroup-root DIR]``."""
    parser = argparse.ArgumentParser(prog="python -m app.runtime.isolation.probe")
    parser.add_argument("--probe", help="a directory inside the workspaces")
    parser.add_argument("--workspaces")
    parser.add_argument("--identity", default=None)
    parser.add_argument("--limits", action="store_true", help="say how blocks' limits are bounded here")
    parser.add_argument("--cgroup-root", type=Path, default=DEFAULT_ROOT, help="the cgroup file system")
    options = parser.parse_args(argv)
    if options.limits:
        print(f"block limits: {block_limits(options.cgroup_root)}")
        return 0
    if options.probe is None or options.workspaces is None:
        parser.error("--probe and --workspaces are required (or --limits)")
    identity = Identity.parse(options.identity) if options.identity else None
    try:
        probe(options.probe, workspaces=options.workspaces, identity=identity)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)  # the last line: the reason
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
