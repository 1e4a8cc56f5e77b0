"""The server's handle on a zygote: its first report says whether its workers may share its PID
namespace; a zygote that dies first, or says something else, fails its start instead of leaving
the pool waiting (or trusting a malformed answer)."""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest

from app.runtime.protocol import encode_frame
from app.runtime.worker_process import WorkerGone
from app.runtime.zygote import Zygote

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
