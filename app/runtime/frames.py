"""The frames the server accepts from a sandbox worker, and what a block's failure becomes.

Everything here is validated before use: a frame passes through the worker, which checks it, but
it comes from the block's process, which is hostile.
"""

from __future__ import annotations

import signal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.runtime.protocol import MAX_FIGURE_BYTES, MAX_FIGURES, MAX_PARALLEL_CALLS, limit_label
from app.runtime.schemas import BlockFailure, HelperCall, Limits


class Frame(BaseModel):
    """A frame from a worker: no field beyond those its type declares."""

    model_config = ConfigDict(extra="forbid")


class ReadyFrame(Frame):
    t: Literal["ready"]
    pid: int = Field(gt=1)


class ExitFrame(Frame):
    """Written by the worker (never the child) once the child is dead and reaped."""

    t: Literal["exit"]
    pid: int
    code: int | None
    signal: int | None
    cpu_seconds: float
    # What the child sent that the protocol does not allow (the worker killed it for that).
    violation: str | None = None
    # A quota the worker measured the block past (and killed it for); ``memory``: the OOM killer
    # struck in the worker's cgroup (the block's whole tree past its memory limit).
    limit: Literal["disk", "disk_files", "cpu_time", "memory"] | None = None
    # It died live, between blocks (not in the middle of one).
    live: bool = False


class CallFrame(Frame):
    t: Literal["call"]
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    call: HelperCall
    # [index, size] of an external call of a ``parallel(...)`` batch (protocol.py).
    batch: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=1, le=MAX_PARALLEL_CALLS)]] | None = (
        None
    )


class RecordFrame(Frame):
    """A sandbox-side helper ran in the child: one journal entry, value or error."""

    t: Literal["record"]
    name: str
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    value: Any = None
    error_type: str | None = None
    error_message: str | None = None


class DoneFrame(Frame):
    t: Literal["done"]
    status: Literal["ok", "error", "limit", "suspended"]
    stdout: str
    results: list[str]
    error: str | None
    limit: str | None
    dropped: list[str]
    replayed: int = Field(ge=0)
    # Sizes of the PNGs that follow the snapshot in the blob.
    figures: list[Annotated[int, Field(gt=0, le=MAX_FIGURE_BYTES)]] = Field(
        default_factory=list, max_length=MAX_FIGURES
    )
    # The child stays live for its conversation's next block (the worker vouches for it).
    live: bool = False
    # How much its resident memory grew since it was forked, in KiB, as the worker measured it
    # (0 unless live): what the pool weighs against the live processes' memory budget.
    grown_kb: int = Field(default=0, ge=0)


class StaleFrame(Frame):
    """The worker's answer to a block for a live child that had died: not run."""

    t: Literal["stale"]


class LiveGone(Exception):
    """The live process a block was sent to had died between blocks; its worker has a fresh
    child, and the block was not run."""


class BlockFailed(Exception):
    """The block ended without reporting (killed, timed out, garbage): the worker is recycled
    and the outcome built from this. ``failure`` is the stable code of why, ``message`` the text
    the model is shown (a limit's label, or ``SandboxError: ...``)."""

    def __init__(self, failure: BlockFailure, message: str) -> None:
        super().__init__(message)
        self.failure: BlockFailure = failure
        self.status: Literal["error", "limit"] = "limit" if failure == "limit" else "error"
        self.message = message


def exit_failure(frame: ExitFrame, limits: Limits) -> BlockFailed:
    """Map how a child died (before reporting) to the block's limit or error."""
    if frame.violation is not None:
        return BlockFailed(
            "protocol_violation", f"SandboxError: the block broke the sandbox protocol ({frame.violation})"
        )
    if frame.limit is not None:
        return BlockFailed("limit", limit_label(frame.limit, limits.model_dump()))
    if frame.signal == signal.SIGXCPU or (
        frame.signal == signal.SIGKILL and frame.cpu_seconds >= limits.cpu_seconds
    ):
        # SIGKILL past the CPU limit is RLIMIT_CPU's hard limit (the code ignored SIGXCPU).
        return BlockFailed("limit", limit_label("cpu_time", limits.model_dump()))
    if frame.signal == signal.SIGXFSZ:
        return BlockFailed("limit", limit_label("file_size", limits.model_dump()))
    if frame.signal is not None:
        name = signal.Signals(frame.signal).name if frame.signal in signal.valid_signals() else ""
        hint = " (possibly out of memory)" if frame.signal == signal.SIGKILL else ""
        return BlockFailed(
            "killed", f"SandboxError: the block's process was killed by {name or frame.signal}{hint}"
        )
    return BlockFailed(
        "exited_early", f"SandboxError: the block's process exited with code {frame.code} before it finished"
    )
