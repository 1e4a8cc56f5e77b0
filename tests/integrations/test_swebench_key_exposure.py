"""The SABRE key of a SWE-bench runner stays out of reach of the commands the model runs.

``bash`` gets a clean environment, but the command runs as the runner's user, and Linux lets a process
read ``/proc/<pid>/environ`` and ``mem`` of another process of its user: ``cat /proc/$PPID/environ``
printed the key. The runner runs here as an ordinary user (nobody, when the tests run as root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path

import pytest
import sabre_swebench

KEY = "sk-runner-secret-0123456789"
RUNNER = textwrap.dedent(
    """
    import asyncio, json, shlex, sys
    from pathlib import Path
    from sabre_swebench.tools import Toolbox
    box = Toolbox(Path(sys.argv[1]))
    commands = ["cat /proc/$PPID/environ", f"{sys.executable} -c {shlex.quote(sys.argv[2])}", "env"]
    print(json.dumps([asyncio.run(box.bash(command)) for command in commands]))
    """
)
SCAN_MEMORY = textwrap.dedent(
    """
    import os, re
    pid = os.getppid()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            try:
                mem.seek(start)
                found = re.search(rb"sk-runner-secret-[0-9]+", mem.read(end - start))
            except (OSError, ValueError, OverflowError):
                continue
            if found:
                print(found.group().decode())
                break
    """
)


def _as_a_user() -> tuple[list[str], str, dict[str, str]]:
    """The command prefix, interpreter and PYTHONPATH that run a Python runner as an ordinary user."""
    if os.getuid() != 0:
        return [], sys.executable, {}
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    if python is None or shutil.which("setpriv") is None:
        pytest.skip("root without setpriv or a system python3 to run the runner as a user")
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if version != str(sys.version_info[:2]):
        pytest.skip(f"system python3 is {version}, not this interpreter's version")
    path = os.pathsep.join([str(Path(sabre_swebench.__file__).parents[1]), sysconfig.get_paths()["purelib"]])
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    return prefix, python, {"PYTHONPATH": path}


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
def test_a_command_cannot_read_the_runners_key() -> None:
    prefix, python, extra = _as_a_user()
    with tempfile.TemporaryDirectory(dir="/tmp") as where:
        root = Path(where)
        if prefix:
            os.chown(root, 65534, 65534)
        env = {"PATH": os.environ["PATH"], "SABRE_API_KEY": KEY, **extra}
        done = subprocess.run(
            [*prefix, python, "-c", RUNNER, str(root), SCAN_MEMORY],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    environ, memory, clean = json.loads(done.stdout)
    assert "PATH=" in clean  # the commands did run
    assert KEY not in clean
    assert KEY not in environ, environ
    assert KEY not in memory, memory
