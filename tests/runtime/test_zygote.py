"""The server's handle on a zygote: its first report says whether its workers may share its PID
namespace; a zygote that dies first, or says something else, fails its start instead of leaving
the pool waiting (or trusting a malformed answer)."""

from __future__ import annotations

import asyncio
import resource
import socket
import sys
import tempfile
from pathlib import Path

import pytest

from app.runtime import RuntimePool
from app.runtime.isolation import Backend
from app.runtime.protocol import encode_frame
from app.runtime.schemas import Limits
from app.runtime.worker_process import WorkerGone
from app.runtime.zygote import Zygote
from tests.runtime.support import BACKENDS, run, started_pool

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def _zygote_writing(data: bytes) -> Zygote:
    """A stand-in zygote process that writes ``data`` on its report pipe and exits."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        f"import sys; sys.stdout.buffer.write({data!r}); sys.stdout.flush()",
        stdout=asyncio.subprocess.PIPE,
    )
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()
    return Zygote(proc, ours, namespaced=False, capacity=1)


@pytest.mark.parametrize("hides", [True, False])
async def test_the_start_report_says_whether_processes_are_hidden(hides: bool) -> None:
    zygote = await _zygote_writing(encode_frame({"t": "start", "hides": hides}))
    try:
        assert await zygote.started() is hides
    finally:
        zygote.kill()
        await zygote.proc.wait()


@pytest.mark.parametrize(
    "data",
    [
        b"",  # died before it said anything
        encode_frame({"t": "clone", "pid": 5}),  # a worker before it started
        encode_frame({"t": "start", "hides": "yes"}),
        encode_frame({"t": "start", "hides": True, "extra": 1}),
        b"\x00\x00garbage",
    ],
)
async def test_a_zygote_that_does_not_start_as_expected_fails_its_start(data: bytes) -> None:
    zygote = await _zygote_writing(data)
    try:
        async with asyncio.timeout(10):
            with pytest.raises(WorkerGone):
                await zygote.started()
        assert zygote.dead
        with pytest.raises(WorkerGone):
            await zygote.clone()
    finally:
        zygote.kill()
        await zygote.proc.wait()


async def test_a_zygote_that_dies_as_it_starts_is_replaced_once(
    workspaces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first zygote dies before its start report (as one killed by the OOM killer at that
    moment would): the pool puts it down and starts another, once; blocks then run."""
    real = Zygote.started
    deaths = 0

    async def dies_first(self: Zygote) -> bool:
        nonlocal deaths
        if deaths == 0:
            deaths += 1
            self.kill()
            await self.proc.wait()
        return await real(self)

    monkeypatch.setattr(Zygote, "started", dies_first)
    async with RuntimePool(size=1, preload=(), sandbox="process", workspaces=workspaces) as pool:
        outcome = await run(pool, "result(6 * 7)", workdir=Path(tempfile.mkdtemp(dir=workspaces)))
    assert outcome.results == ["42"]
    assert deaths == 1


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_server_passes_workers_their_channels_at_its_hard_descriptor_limit(
    backend: Backend, workspaces: Path, tmp_path: Path
) -> None:
    """Linux refuses an SCM_RIGHTS send while the sender's user has more descriptors in flight
    than the sender's soft RLIMIT_NOFILE, and an unprivileged server's blocks run as its user:
    at a soft limit of 1024 a few blocks keeping descriptors in flight could stop it from
    passing any new worker its channel. The pool raises its soft limit to the hard one before it
    starts a worker (root, exempt from that check, runs this test: it checks the limit), and a
    block still gets its own ``open_files``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= 1024:
        pytest.skip(f"the hard RLIMIT_NOFILE here is {hard}: nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        async with started_pool(backend, workspaces, size=1) as pool:
            assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
            outcome = await run(
                pool,
                "import resource\nresult(resource.getrlimit(resource.RLIMIT_NOFILE))",
                workdir=tmp_path,
                limits=Limits(open_files=64),
            )
            assert outcome.status == "ok", outcome.error
            assert outcome.results == ["[64, 64]"]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
