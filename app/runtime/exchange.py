"""One block's exchange with its sandbox child: the request sent, calls answered, the outcome.

``BlockRequest`` encodes what the pool sends for a block (for a fresh child, with the snapshot to
restore; or for the conversation's live child); ``Exchange`` reads the child's frames (through its
worker), answers its calls, journals them, and builds the ``BlockOutcome``; a parked exchange waits
for the answer to its external call.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog
from pydantic import ValidationError

from app.runtime.frames import (
    BlockFailed,
    CallFrame,
    DoneFrame,
    ExitFrame,
    LiveGone,
    ReadyFrame,
    RecordFrame,
    StaleFrame,
    exit_failure,
)
from app.runtime.protocol import (
    JOURNALED_SANDBOX_HELPERS,
    MAX_CALLS,
    MAX_FIGURE_BYTES,
    MAX_FIGURES,
    MAX_HEADER_BYTES,
    MAX_JOURNAL_BYTES,
    MAX_RECORDS,
    PNG_SIGNATURE,
    FrameError,
    encode_frame,
    journal_bytes,
    limit_label,
    run_request,
)
from app.runtime.schemas import (
    BlockOutcome,
    CallReply,
    CallRunner,
    HelperCall,
    JournalEntry,
    Limits,
    SandboxTool,
    journal_full,
)
from app.runtime.worker_process import WorkerGone, WorkerProcess

logger = logging.getLogger(__name__)
log = structlog.get_logger(__name__)

OnCall = Callable[[HelperCall], Awaitable[CallReply]]
# A child gets this long past its wall clock to stop itself (keeping its output) before the
# parent kills it.
KILL_GRACE_SECONDS: Final = 0.5
# How long a worker may take to report a child's end and have the next one ready.
REARM_TIMEOUT_SECONDS: Final = 30.0


@dataclass(frozen=True)
class BlockRequest:
    """What the pool sends a worker for one block."""

    code: str
    workdir: Path
    limits: Limits
    internal_helpers: Sequence[str]
    external_tools: Mapping[str, Sequence[str]]
    journal: Sequence[JournalEntry]
    sandbox_tools: Sequence[SandboxTool]
    tenant: str = ""  # whose share of the workers it takes (``WorkerSupervisor``); not sent

    @functools.cached_property
    def runners(self) -> dict[str, CallRunner]:
        """Who runs each name the block may call on its parent: the service or the caller."""
        runners: dict[str, CallRunner] = dict.fromkeys(self.internal_helpers, "service")
        return runners | dict.fromkeys(self.external_tools, "caller")

    @functools.cached_property
    def replayed_bytes(self) -> int:
        """``journal_bytes`` of ``journal``, measured once per block for the exchange, the
        worker and the child alike (each encoded the journal again to measure it), and only
        when a process gets the block (a resumed one continues its exchange)."""
        return journal_bytes([entry.to_wire() for entry in self.journal])

    def encode(
        self, *, keep: bool, snapshot: bytes = b"", live_pid: int | None = None, prepare: bool = False
    ) -> bytes:
        """The ``run`` frame: for a fresh child with the snapshot to restore, or (``live_pid``)
        for the live child of this conversation, which has the namespace already; ``prepare``:
        the child restores the snapshot and stays live, running no code (``code`` is ignored)."""
        header = run_request(
            code=self.code,
            workdir=str(self.workdir),
            limits=self.limits.to_wire(),
            helpers=self.internal_helpers,
            tools=self.external_tools,
            journal=[entry.to_wire() for entry in self.journal],
            replayed_bytes=self.replayed_bytes,
            local_tools=[(t.name, list(t.params), t.file, t.function, t.source) for t in self.sandbox_tools],
            keep=keep,
            live_pid=live_pid,
            prepare=prepare,
        )
        return encode_frame(header, b"" if live_pid is not None else snapshot)


class Exchange:
    """The conversation with one child about one block: calls in, replies out, then done."""

    def __init__(
        self,
        *,
        worker: WorkerProcess,
        limits: Limits,
        names: Mapping[str, CallRunner],
        journal: Sequence[JournalEntry],
        on_call: OnCall,
        local: frozenset[str] = frozenset(),
        may_park: Callable[[], bool] = lambda: False,
        replayed_bytes: int | None = None,
    ) -> None:
        """``replayed_bytes``: ``journal_bytes`` of ``journal``, if the caller measured it."""
        self._worker = worker
        self._local = local  # the block's sandbox tools: journaled by record frames
        self._may_park = may_park
        self._parked = False
        self._keep = False  # the block's process was asked to stay live
        self._live_run = False  # the block went to a live process
        self._heard = False  # a frame of the block came back
        self.live = False  # the process stays live after the block
        self.grown_kb = 0  # then: how much memory it holds beyond its fork (the worker's figure)
        self._remaining = limits.wall_clock_seconds + KILL_GRACE_SECONDS
        self._limits = limits
        self._names = names
        self._replay = list(journal)  # a copy: the caller may extend its list for the resume
        self._on_call = on_call
        self._new: list[JournalEntry] = []
        self._replayed = 0
        self._pending: HelperCall | None = None
        # Calls of an open ``parallel`` batch deferred so far (they wait with the last pending
        # one), and the batch's next index and size (0, 0: no batch open).
        self._deferred: list[HelperCall] = []
        self._batch = (0, 0)
        self._live = False  # a call reached the parent
        # What this run received, capped (the worker caps it too: the child is hostile).
        self._calls = 0
        self._records = 0
        # What the answers to its calls weigh: they stay in ``_new`` (the journal a pause stores) for
        # the whole block, so a loop over a service tool with large results held them all here.
        # Both start from the journal the block replays (``journal_bytes``), as in the child.
        if replayed_bytes is None:
            replayed_bytes = journal_bytes([entry.to_wire() for entry in journal])
        self._record_bytes = self._answer_bytes = replayed_bytes

    @property
    def journal(self) -> list[JournalEntry]:
        """Replayed entries, then the calls answered in this run, in call order."""
        return [*self._replay[: self._replayed], *self._new]

    async def run(self, request: bytes, *, keep: bool, live_run: bool = False) -> BlockOutcome | None:
        """Send the block, answer its calls, return its outcome; BlockFailed if it fails.

        None: the block called an external tool and is parked (``may_park``): its process waits,
        alive, for the answer; ``resume`` continues it, ``release`` lets it stop as suspended.
        ``keep``: the process was asked to stay live after the block (``live`` then says whether
        it did); ``live_run``: the block went to a live process (LiveGone if that had died).
        """
        self._keep, self._live_run = keep, live_run
        await self._send(request)
        return await self._serve()

    async def resume(self, answer: JournalEntry, *, on_call: OnCall) -> BlockOutcome | None:
        """Continue a parked block: its pending call answered with ``answer`` (the entry the
        service journaled for it), later calls going to ``on_call``."""
        assert self._pending is not None
        assert self._parked
        self._on_call = on_call
        self._parked = False
        self._pending = None
        self._new.append(answer)
        if answer.error_type is None and answer.error_message is None:
            reply = CallReply(kind="value", value=answer.value)
        else:
            reply = CallReply(kind="error", error_type=answer.error_type, error_message=answer.error_message)
        data = encode_reply(reply)
        self._answer_bytes += len(data)  # the service kept it within the cap (``journal_full``)
        await self._send(data)
        return await self._serve()

    async def release(self) -> None:
        """Let a parked block stop as suspended (nobody resumed it here in time)."""
        assert self._parked
        self._parked = False
        await self._send(encode_reply(CallReply(kind="suspend")))
        await self._serve()

    async def _send(self, data: bytes) -> None:
        try:
            await self._worker.send(data)
        except WorkerGone as exc:
            raise BlockFailed("worker_lost", f"SandboxError: {exc}") from None

    @property
    def parked_call(self) -> HelperCall | None:
        """The external call a parked block waits on."""
        return self._pending if self._parked else None

    async def _serve(self) -> BlockOutcome | None:
        limits = self._limits
        # stdout, results and the error are each capped at stdout_bytes in the child (and JSON
        # may escape a byte into six); a call's arguments may be large on their own.
        max_header = MAX_HEADER_BYTES + 20 * limits.stdout_bytes
        loop = asyncio.get_running_loop()
        try:
            while True:
                began = loop.time()
                try:
                    async with asyncio.timeout(self._remaining):
                        header, blob = await self._worker.read(
                            max_blob=limits.snapshot_bytes + MAX_FIGURES * MAX_FIGURE_BYTES,
                            max_header=max_header,
                        )
                except TimeoutError:
                    raise BlockFailed("limit", limit_label("wall_clock", limits.model_dump())) from None
                self._remaining -= loop.time() - began
                if self._live_run and not self._heard and header["t"] == "exit":
                    ended = ExitFrame.model_validate(header)
                    if ended.live:
                        await self._skip_to_stale()
                        raise LiveGone
                self._heard = True
                match header["t"]:
                    case "call" if self._pending is None:
                        self._calls += 1
                        if self._calls > MAX_CALLS:
                            raise _violation(f"more than {MAX_CALLS} calls")
                        await self._answer(CallFrame.model_validate(header))
                        if self._parked:
                            return None
                    case "record" if self._pending is None and not self._batch[1]:
                        self._records += 1
                        self._record_bytes += self._worker.last_header_bytes
                        if self._records > MAX_RECORDS or self._record_bytes > MAX_JOURNAL_BYTES:
                            raise _violation("the block's journal is too large")
                        self._record(RecordFrame.model_validate(header))
                    case "done":
                        return self._done(DoneFrame.model_validate(header), blob)
                    case "exit":
                        ended = ExitFrame.model_validate(header)
                        if ended.violation is not None:
                            log.warning("sandbox_protocol_violation", violation=ended.violation)
                        raise exit_failure(ended, limits)
                    case tag:
                        raise _violation(f"unexpected {tag!r} frame")
        except WorkerGone as exc:
            raise BlockFailed("worker_lost", f"SandboxError: {exc}") from None
        except FrameError as exc:
            raise _violation(str(exc)) from None
        except ValidationError as exc:
            raise _violation(f"malformed frame: {exc.errors()[0]}") from None

    async def _skip_to_stale(self) -> None:
        """After a live child's death: the worker's fresh child says ready, then the worker
        says the block was not run."""
        async with asyncio.timeout(REARM_TIMEOUT_SECONDS):
            while True:
                header, _ = await self._worker.read(max_blob=0)
                if header["t"] == "ready":
                    self._worker.child_pid = ReadyFrame.model_validate(header).pid
                else:
                    StaleFrame.model_validate(header)
                    return

    async def _answer(self, frame: CallFrame) -> None:
        call = frame.call
        if self._names.get(call.name) != call.runs:
            raise _violation(
                f"call to {call.name!r}, which the {call.runs} does not run",
            )
        last = self._step_batch(frame)
        # Calls reach the parent only once the whole journal has been replayed.
        self._replayed = len(self._replay)
        self._live = True
        reply = await self._on_call(call)
        try:
            data = encode_reply(reply)
        except (TypeError, ValueError) as exc:
            # Journal values must be JSON; tell the code rather than fail the whole turn.
            logger.warning("reply to %s is not JSON: %s", call.name, exc)
            reply = CallReply(
                kind="error",
                error_type="TypeError",
                error_message=f"{call.name} returned a value that is not JSON: {exc}",
            )
            data = encode_reply(reply)
        if reply.kind in ("value", "error"):
            if self._answer_bytes + len(data) > MAX_JOURNAL_BYTES:
                reply = journal_full(call.name)
                data = encode_reply(reply)
            self._answer_bytes += len(data)
        if reply.kind == "suspend" and not last:
            self._deferred.append(call)  # it waits with the rest of its batch
            data = encode_reply(CallReply(kind="deferred"))
        elif reply.kind == "suspend":
            self._pending = call
            if self._may_park() and not self._deferred:
                # The child stays blocked on this call: a resume here answers it directly.
                self._parked = True
                return
        else:
            self._new.append(JournalEntry.for_call(call, reply, digest=frame.digest))
            if last and self._deferred:  # the batch's last call was answered, earlier ones wait
                self._pending = self._deferred.pop()
                data = encode_reply(CallReply(kind="suspend"))
        await self._worker.send(data)

    def _step_batch(self, frame: CallFrame) -> bool:
        """Check a call's place in the open ``parallel`` batch (calls of a batch come in order,
        external, with nothing between them); True when it ends the batch (or is not in one)."""
        index, size = frame.batch if frame.batch is not None else (0, 0)
        if frame.batch is None:
            if self._batch[1]:
                raise _violation("a call in the middle of a parallel batch")
            return True
        if frame.call.runs != "caller" or index != self._batch[0] or index >= size:
            raise _violation("a parallel batch out of order")
        if self._batch[1] and size != self._batch[1]:
            raise _violation("a parallel batch changed its size")
        self._batch = (0, 0) if index == size - 1 else (index + 1, size)
        return index == size - 1

    def _record(self, frame: RecordFrame) -> None:
        """Journal a sandbox-side helper the child ran (it reports after the journal replayed)."""
        if frame.name not in JOURNALED_SANDBOX_HELPERS and frame.name not in self._local:
            raise _violation(f"a record of an unknown helper {frame.name!r}")
        self._replayed = len(self._replay)
        self._live = True
        failed = frame.error_type is not None or frame.error_message is not None
        error = (frame.error_type, frame.error_message) if failed else None
        self._new.append(JournalEntry.of(frame.name, frame.digest, value=frame.value, error=error))

    def _figures(self, frame: DoneFrame, blob: bytes) -> tuple[bytes, list[bytes]]:
        """Split the blob into the snapshot and the figures; each must be a PNG (checked by its
        signature only: the parent never decodes what the child sends)."""
        if not frame.figures:
            return blob, []
        end = len(blob) - sum(frame.figures)
        if end < 0:
            raise _violation("the figures do not fit in the frame")
        figures: list[bytes] = []
        start = end
        for size in frame.figures:
            image = blob[start : start + size]
            if not image.startswith(PNG_SIGNATURE):
                raise _violation("a figure is not a PNG")
            figures.append(image)
            start += size
        return blob[:end], figures

    def _done(self, frame: DoneFrame, blob: bytes) -> BlockOutcome:
        if (frame.status == "suspended") != (self._pending is not None):
            raise _violation("the block's process ignored a suspend")
        if frame.replayed > len(self._replay) or (self._live and frame.replayed != len(self._replay)):
            raise _violation("inconsistent replay count")
        self._replayed = frame.replayed
        self.live = frame.live and self._keep and frame.status in ("ok", "error")
        self.grown_kb = frame.grown_kb if self.live else 0
        blob, figures = self._figures(frame, blob)
        if len(blob) > self._limits.snapshot_bytes:
            raise _violation("the snapshot is larger than its limit")
        keep_snapshot = frame.status in ("ok", "error") and bool(blob)
        # Every field is validated already (the frame above, the journal by its model).
        return BlockOutcome.model_construct(
            status=frame.status,
            stdout=frame.stdout,
            results=frame.results,
            error=frame.error,
            limit=frame.limit,
            snapshot=blob if keep_snapshot else None,
            dropped=frame.dropped,
            journal=self.journal,
            pending=self._pending,
            duration_ms=0.0,
            more_pending=self._deferred if self._pending is not None else [],
            figures=figures if frame.status in ("ok", "error") else [],
        )


def _violation(message: str) -> BlockFailed:
    """The block broke the sandbox protocol: it is failed, and its worker recycled."""
    return BlockFailed("protocol_violation", f"SandboxError: {message}")


def encode_reply(reply: CallReply) -> bytes:
    return encode_frame(
        {
            "t": "reply",
            "kind": reply.kind,
            "value": reply.value,
            "error_type": reply.error_type,
            "error_message": reply.error_message,
        }
    )
