"""Attacker pass on the process backend with the server as root: each conversation's blocks run as
a uid derived from its directory (2^28 of them), so two conversations can get the same one (about
one pair in 2^14 directories). Such a pair must still not reach each other: each block is in a
Landlock domain of its own, which bounds its files, its signals and ptrace (so /proc's private
files) to its own processes, whatever the uid."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from app.runtime import RuntimePool, landlock
from app.runtime.isolation import conversation_identity
from app.runtime.isolation.identity import sandbox_identity
from tests.runtime.support import run, started_pool

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="conversations get uids of their own only when the server is root"
    ),
]

# The victim: a secret in its directory, its pid, then it waits (the attacker aims meanwhile).
VICTIM = """\
import os, time
with open('secret.txt', 'w') as out:
    out.write('the victim secret')
os.environ['VICTIM_TOKEN'] = 'env-secret'
result(os.getpid())
result(os.getuid())
time.sleep({seconds})
result('alive')
"""

# The attacker, as the same uid: its directory's name and the victim's pid are given.
ATTACKER = """\
import errno, json, os, signal
def attempt(action):
    try:
        return 'ok: ' + repr(action())[:40]
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
pid = {pid}
tried = {{
    'uid': os.getuid(),
    'read the secret': attempt(lambda: open({secret!r}).read()),
    'list its directory': attempt(lambda: os.listdir({victim_dir!r})),
    'environ': attempt(lambda: open(f'/proc/{{pid}}/environ', 'rb').read()),
    'mem': attempt(lambda: open(f'/proc/{{pid}}/mem', 'rb').read(1)),
    'fds': attempt(lambda: os.listdir(f'/proc/{{pid}}/fd')),
    'signal 0': attempt(lambda: os.kill(pid, 0)),
    'SIGSTOP': attempt(lambda: os.kill(pid, signal.SIGSTOP)),
    'SIGKILL': attempt(lambda: os.kill(pid, signal.SIGKILL)),
}}
result(json.dumps(tried))
"""


def _colliding_pair(workspaces: Path) -> tuple[Path, Path]:
    """Two conversation directories whose blocks run as the same uid (a birthday search)."""
    base = sandbox_identity()
    seen: dict[int, Path] = {}
    while True:
        directory = workspaces / f"conv-{secrets.token_hex(8)}"
        identity = conversation_identity(str(directory), base=base, backend="process")
        assert identity is not None
        if identity.uid in seen:
            return seen[identity.uid], directory
        seen[identity.uid] = directory


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def pool(workspaces: Path) -> AsyncIterator[RuntimePool]:
    async with started_pool("process", workspaces, size=2, live_seconds=0.0) as started:
        yield started


async def test_two_conversations_of_one_uid_do_not_reach_each_other(
    pool: RuntimePool, workspaces: Path
) -> None:
    victim_dir, attacker_dir = _colliding_pair(workspaces)
    for directory in (victim_dir, attacker_dir):
        directory.mkdir()
    victim = asyncio.ensure_future(run(pool, VICTIM.format(seconds=2.0), workdir=victim_dir))
    for _ in range(100):  # until the victim has written its secret and says who it is
        if (victim_dir / "secret.txt").exists():
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    pid = _block_pid(victim_dir)
    code = ATTACKER.format(pid=pid, secret=str(victim_dir / "secret.txt"), victim_dir=str(victim_dir))
    attacker = await run(pool, code, workdir=attacker_dir)
    assert attacker.status == "ok", attacker.error
    tried = json.loads(attacker.results[0])
    outcome = await victim
    assert outcome.status == "ok", outcome.error
    assert outcome.results[1:] == [str(tried["uid"]), "alive"]  # one uid, and the victim lived on
    denied = {"EACCES", "EPERM"}
    for what in ("read the secret", "list its directory", "environ", "mem", "fds"):
        assert tried[what] in denied, (what, tried)
    if landlock.scopes_signals():
        for what in ("signal 0", "SIGSTOP", "SIGKILL"):
            assert tried[what] == "EPERM", (what, tried)


def _block_pid(workdir: Path) -> int:
    """The host pid of the process whose working directory is ``workdir`` (the victim's block)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/cwd") == str(workdir):
                return int(entry)
        except OSError:
            continue
    raise AssertionError(f"no process works in {workdir}")
