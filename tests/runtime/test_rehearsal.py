"""The idle child's rehearsal (``app.runtime.child.main.rehearse``): a dry trivial block run before
the child says ready, so its first block does not pay the copy-on-write faults of the common path.
It must leave the process exactly as a fresh fork is: nothing of it may reach the block."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_PROBE = """
import json, os, resource, signal, sys
from app.runtime import library
from app.runtime.child import running
from app.runtime.child.main import rehearse

def state():
    return {
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "path": list(sys.path),
        "stdout": id(sys.stdout),
        "stderr": id(sys.stderr),
        "block": running.block is None,
        "current": running.current is None,
        "host": library._host is None,
        "timer": signal.getitimer(signal.ITIMER_REAL),
        "limits": [resource.getrlimit(r) for r in (resource.RLIMIT_CPU, resource.RLIMIT_AS,
                   resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE)],
        "handlers": [str(signal.getsignal(s)) for s in (signal.SIGXCPU, signal.SIGALRM)],
    }

before = state()
rehearse()
after = state()
sys.__stdout__.write(json.dumps({"before": before, "after": after}))
"""


def test_the_rehearsal_leaves_the_process_as_it_found_it(tmp_path: Path) -> None:
    """Working directory, environment (HOME), import path, output streams, the running block and
    the helpers' binding, the wall-clock timer, the limits and the signal handlers: all as before,
    and nothing written to the output pipe (fd 1, which the worker reads as the block's output)."""
    env = {k: v for k, v in os.environ.items() if k != "HOME"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["after"] == report["before"]
    assert report["before"]["block"]
    assert report["before"]["host"]
