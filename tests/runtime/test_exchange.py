"""``Exchange`` against a worker that lies: the server reads a block's frames from its sandbox
worker, which runs next to hostile code and must not be believed either. A socket pair stands for
the worker (no sandbox runs): whatever it sends fails the block as a protocol violation, or its
worker as lost, and never reaches ``on_call`` or the outcome unchecked.

The same checks run end to end, from a block that writes forged frames, in test_attacks.py."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from app.runtime.exchange import BlockRequest, Exchange
from app.runtime.frames import BlockFailed
from app.runtime.protocol import MAX_HEADER_BYTES, PNG_SIGNATURE, PREFIX, call_digest, encode_frame
from app.runtime.schemas import BlockOutcome, CallReply, CallRunner, HelperCall, Limits
from app.runtime.worker_process import WorkerProcess

LIMITS = Limits(wall_clock_seconds=5, snapshot_bytes=1000)
NAMES: Mapping[str, CallRunner] = {"llm_call": "service", "lookup": "caller"}


def _call(name: str, runs: str = "service", **kwargs: Any) -> dict[str, Any]:
    """A call frame as a worker would forward it."""
    call = {
        "name": name,
        "runs": runs,
        "args": [],
        "kwargs": kwargs,
        "arguments": kwargs,
        "line": 1,
        "code": "x",
    }
    return {"t": "call", "digest": call_digest(name=name, args=[], kwargs=kwargs), "call": call}


def _done(**fields: Any) -> dict[str, Any]:
    frame = {
        "t": "done",
        "status": "ok",
        "stdout": "",
        "results": ["1"],
        "error": None,
        "limit": None,
        "dropped": [],
        "replayed": 0,
    }
    return {**frame, **fields}


class Calls:
    """``on_call``: answers every call with ``reply``, and remembers them."""

    def __init__(self, reply: CallReply | None = None) -> None:
        self.reply = reply or CallReply(kind="value", value="answer")
        self.calls: list[HelperCall] = []

    async def __call__(self, call: HelperCall) -> CallReply:
        self.calls.append(call)
        return self.reply


class FakeWorker:
    """The worker's end of the pipe: reads what the server sends, writes whatever a test wants."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    async def receive(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        prefix = await self._read(loop, PREFIX.size)
        header_len, blob_len = PREFIX.unpack(prefix)
        header = json.loads(await self._read(loop, header_len))
        await self._read(loop, blob_len)
        return cast(dict[str, Any], header)

    async def _read(self, loop: asyncio.AbstractEventLoop, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = await loop.sock_recv(self._sock, size - len(data))
            assert chunk, "the server closed the pipe"
            data += chunk
        return data

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self._sock, data)

    async def frame(self, header: Mapping[str, Any], blob: bytes = b"") -> None:
        await self.send(encode_frame(header, blob))

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[WorkerProcess, FakeWorker]]:
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=ours)
    worker = WorkerProcess(reader, writer, pid=2, host=cast(Any, None))
    fake = FakeWorker(theirs)
    yield worker, fake
    writer.close()
    fake.close()


def _exchange(worker: WorkerProcess, on_call: Calls, *, limits: Limits = LIMITS) -> Exchange:
    return Exchange(worker=worker, limits=limits, names=NAMES, journal=[], on_call=on_call)


def _request() -> bytes:
    block = BlockRequest(
        code="result(1)",
        workdir=Path("/w/conversation"),
        limits=LIMITS,
        internal_helpers=["llm_call"],
        external_tools={"lookup": ["key"]},
        journal=[],
        sandbox_tools=[],
    )
    return block.encode(keep=False)


async def _run(
    pair: tuple[WorkerProcess, FakeWorker], *frames: bytes, on_call: Calls | None = None
) -> tuple[BlockOutcome | None, Calls]:
    """Run a block whose worker answers the request with ``frames`` (raw bytes, sent at once)."""
    worker, fake = pair
    calls = on_call or Calls()
    running = asyncio.ensure_future(_exchange(worker, calls).run(_request(), keep=False))
    assert (await fake.receive())["t"] == "run"
    for frame in frames:
        await fake.send(frame)
    async with asyncio.timeout(5):
        return await running, calls


async def test_an_honest_worker_gets_its_outcome(pair: tuple[WorkerProcess, FakeWorker]) -> None:
    """The control: a call answered and journaled, then a done with a snapshot and a figure."""
    worker, fake = pair
    calls = Calls()
    running = asyncio.ensure_future(_exchange(worker, calls).run(_request(), keep=False))
    await fake.receive()
    await fake.frame(_call("llm_call", prompt="hi"))
    assert await fake.receive() == {
        "t": "reply",
        "kind": "value",
        "value": "answer",
        "error_type": None,
        "error_message": None,
    }
    figure = PNG_SIGNATURE + b"image"
    await fake.frame(_done(figures=[len(figure)]), b"snapshot" + figure)
    outcome = await running
    assert outcome is not None
    assert (outcome.status, outcome.results, outcome.snapshot, outcome.figures) == (
        "ok",
        ["1"],
        b"snapshot",
        [figure],
    )
    assert [entry.name for entry in outcome.journal] == ["llm_call"]
    assert [call.name for call in calls.calls] == ["llm_call"]


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (_call("lookup", runs="service", key="k"), "which the service does not run"),  # the caller's tool
        (_call("os.system", runs="service"), "which the service does not run"),
        ({**_call("llm_call"), "digest": "not a digest"}, "malformed frame"),
        ({**_call("llm_call"), "extra": 1}, "malformed frame"),
        ({"t": "ready", "pid": 7}, "unexpected 'ready' frame"),
        ({"t": "stale"}, "unexpected 'stale' frame"),
        ({"t": "reply", "kind": "value"}, "unexpected 'reply' frame"),
        (_done(status="suspended"), "ignored a suspend"),
        (_done(replayed=3), "inconsistent replay count"),
        (_done(status="ok", stdout=7), "malformed frame"),
        ({**_call("lookup", runs="caller", key="k"), "batch": [1, 2]}, "parallel batch out of order"),
    ],
)
async def test_a_frame_the_block_could_not_have_sent_is_a_violation(
    pair: tuple[WorkerProcess, FakeWorker], frame: dict[str, Any], why: str
) -> None:
    with pytest.raises(BlockFailed) as failed:
        await _run(pair, encode_frame(frame))
    assert failed.value.failure == "protocol_violation"
    assert why in failed.value.message


async def test_no_call_of_a_violating_frame_reaches_the_service(
    pair: tuple[WorkerProcess, FakeWorker],
) -> None:
    calls = Calls()
    with pytest.raises(BlockFailed):
        await _run(pair, encode_frame(_call("lookup", runs="service", key="k")), on_call=calls)
    assert calls.calls == []


@pytest.mark.parametrize(
    ("figures", "blob", "why"),
    [
        ([100], b"x" * 50, "do not fit"),
        ([8], b"snapshotNOTAPNG!", "not a PNG"),
        ([], b"s" * 1001, "larger than its limit"),  # LIMITS.snapshot_bytes
    ],
)
async def test_a_done_whose_blob_lies_is_a_violation(
    pair: tuple[WorkerProcess, FakeWorker], figures: list[int], blob: bytes, why: str
) -> None:
    with pytest.raises(BlockFailed) as failed:
        await _run(pair, encode_frame(_done(figures=figures), blob))
    assert failed.value.failure == "protocol_violation"
    assert why in failed.value.message


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (PREFIX.pack(MAX_HEADER_BYTES + 20 * LIMITS.stdout_bytes + 1, 0), "frame header of"),
        (PREFIX.pack(1, 0) + b"{", "frame header of"),
        (PREFIX.pack(10, 10**9), "frame blob of"),
        (PREFIX.pack(4, 0) + b"null", ""),
        (PREFIX.pack(9, 0) + b'{"t": 1} ', ""),
        (PREFIX.pack(23, 0) + b'{"t":"done","x":NaN}   ', ""),
        (PREFIX.pack(6, 0) + b"\xff\xfe{}}}", ""),
    ],
)
async def test_a_frame_that_is_not_one_is_a_violation(
    pair: tuple[WorkerProcess, FakeWorker], raw: bytes, why: str
) -> None:
    with pytest.raises(BlockFailed) as failed:
        await _run(pair, raw)
    assert failed.value.failure == "protocol_violation"
    assert why in failed.value.message


async def test_a_worker_that_goes_away_mid_frame_is_lost(pair: tuple[WorkerProcess, FakeWorker]) -> None:
    worker, fake = pair
    running = asyncio.ensure_future(_exchange(worker, Calls()).run(_request(), keep=False))
    await fake.receive()
    await fake.send(encode_frame(_done())[:10])
    fake.close()
    with pytest.raises(BlockFailed) as failed:
        async with asyncio.timeout(5):
            await running
    assert failed.value.failure == "worker_lost"


async def test_a_worker_that_says_nothing_meets_the_wall_clock(
    pair: tuple[WorkerProcess, FakeWorker],
) -> None:
    worker, fake = pair
    quick = Limits(wall_clock_seconds=0.2)
    running = asyncio.ensure_future(_exchange(worker, Calls(), limits=quick).run(_request(), keep=False))
    await fake.receive()
    with pytest.raises(BlockFailed) as failed:
        async with asyncio.timeout(5):
            await running
    assert failed.value.failure == "limit"
