"""The runtime's data models: what the orchestrator passes in and gets back for one block."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.runtime.protocol import MAX_JOURNAL_BYTES, CallRunner, Runner, WireEntry, WireLimits, call_digest

__all__ = ["CallRunner", "Runner"]
# The words turns paused before the one vocabulary stored for ``HelperCall.runs``.
_LEGACY_KIND: dict[str, CallRunner] = {"internal": "service", "external": "caller"}


class Limits(BaseModel):
    """Resource limits of one block; authority comes from the server, never from the code.
    The one definition: the service's (``SABRE_BLOCK_<NAME>``, ``Settings.block_limits``) and a
    persona's overrides (``personas.models.Limits``) name the same fields (tested)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_seconds: float = Field(default=10, gt=0)
    memory_mb: int = Field(default=2048, gt=0)
    wall_clock_seconds: float = Field(default=30, gt=0)
    max_processes: int = Field(default=64, gt=0)
    file_size_mb: int = Field(default=100, gt=0)
    open_files: int = Field(default=256, gt=0)
    stdout_bytes: int = Field(default=32_000, gt=0)
    snapshot_bytes: int = Field(default=50_000_000, gt=0)
    # The conversation's working directory: bytes allocated and entries (files, directories).
    disk_mb: int = Field(default=1024, gt=0)
    disk_files: int = Field(default=10_000, gt=0)

    def to_wire(self) -> WireLimits:
        """The limits as the child reads them."""
        return WireLimits(
            cpu_seconds=self.cpu_seconds,
            memory_mb=self.memory_mb,
            wall_clock_seconds=self.wall_clock_seconds,
            max_processes=self.max_processes,
            file_size_mb=self.file_size_mb,
            open_files=self.open_files,
            stdout_bytes=self.stdout_bytes,
            snapshot_bytes=self.snapshot_bytes,
            disk_mb=self.disk_mb,
            disk_files=self.disk_files,
        )


class SandboxTool(BaseModel):
    """A persona's Python tool (``file.py::function``), run inside the sandbox next to the code.

    The source travels with the block (the sandbox cannot see the persona's files); the child
    compiles it on the first call, calls ``function`` with the arguments bound to ``params`` (the
    schema's properties, in order) by name, and journals the JSON result like ``FS`` calls.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    params: tuple[str, ...]
    file: str  # where the source came from: tracebacks and the module's __file__ name it
    function: str
    source: str


class HelperCall(BaseModel):
    """A call the block's code made that leaves the sandbox: to a helper the service runs, or a
    tool the caller runs (``runs``).

    ``args``/``kwargs`` are JSON values (service: best effort, repr() for non-JSON values;
    caller: exact, or the code got a TypeError). ``arguments`` (caller only) maps the
    positional arguments to the tool's parameter names, merged with the keyword arguments.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    runs: CallRunner
    args: list[Any]
    kwargs: dict[str, Any]
    arguments: dict[str, Any]
    line: int | None
    code: str | None

    @model_validator(mode="before")
    @classmethod
    def _legacy_kind(cls, data: Any) -> Any:
        """A pending call stored before ``runs`` named it ``kind``: internal/external."""
        if isinstance(data, dict) and "kind" in data and "runs" not in data:
            data = {**data, "runs": _LEGACY_KIND.get(data["kind"], data["kind"])}
            del data["kind"]
        return data

    def digest(self) -> str:
        """The journal digest of this call (the same the child computed)."""
        return call_digest(name=self.name, args=self.args, kwargs=self.kwargs)


class CallReply(BaseModel):
    """The parent's answer to a ``HelperCall``: a value, an error, or suspend the block.

    ``deferred`` is only ever sent by the pool to the child: the external call of a
    ``parallel(...)`` batch waits for the caller with the rest of the batch.
    """

    kind: Literal["value", "error", "suspend", "deferred"]
    value: Any = None
    error_type: str | None = None
    error_message: str | None = None


def journal_full(name: str) -> CallReply:
    """What a call gets in place of its answer once the answers in its block's journal reach
    ``MAX_JOURNAL_BYTES`` (``protocol.journal_bytes``): the code can catch it and go on with less."""
    return CallReply(
        kind="error",
        error_type="ToolError",
        error_message=(
            f"{name}: the answers to this block's calls passed {MAX_JOURNAL_BYTES} bytes; "
            "work on smaller pieces, or over several blocks"
        ),
    )


class JournalEntry(BaseModel):
    """One completed helper call of a block, replayed (not re-run) when the block runs again.

    The one converter of journal entries: built from an answer (``of``, ``for_call``), stored as
    this model, sent to the child as ``to_wire()``."""

    name: str
    digest: str
    value: Any = None
    error_type: str | None = None
    error_message: str | None = None

    @classmethod
    def of(
        cls, name: str, digest: str, *, value: Any = None, error: tuple[str | None, str | None] | None
    ) -> JournalEntry:
        """A call that returned ``value``, or (``error``: its type and message) raised."""
        if error is None:
            return cls(name=name, digest=digest, value=value)
        return cls(name=name, digest=digest, error_type=error[0] or "Error", error_message=error[1] or "")

    @classmethod
    def for_call(cls, call: HelperCall, reply: CallReply, *, digest: str | None = None) -> JournalEntry:
        """The entry recording ``reply`` as the answer to ``call`` (e.g. a pending tool call);
        ``digest``: the call's, when already known."""
        if reply.kind in ("suspend", "deferred"):
            raise ValueError(f"a {reply.kind} reply is not an answer")
        error = (reply.error_type, reply.error_message) if reply.kind == "error" else None
        return cls.of(call.name, digest or call.digest(), value=reply.value, error=error)

    @property
    def failed(self) -> bool:
        """Whether the call raised."""
        return self.error_type is not None or self.error_message is not None

    def to_wire(self) -> WireEntry:
        """The entry as the child reads it (``protocol.WireEntry``)."""
        if not self.failed:
            return [self.name, self.digest, self.value]
        return [self.name, self.digest, None, self.error_type or "Error", self.error_message or ""]


BlockProcess = Literal["fresh", "live", "prepared", "resumed"]
# Why the runtime ended a block that did not report its own end (stable codes, for metrics and logs):
# a resource limit; the block broke the protocol (a frame the child may not send, a lie about its
# replay, a forged figure); its process was killed by a signal (often the memory limit) or exited
# before reporting; or the worker itself died.
BlockFailure = Literal["limit", "protocol_violation", "killed", "exited_early", "worker_lost"]


class BlockOutcome(BaseModel):
    """How one block ended, and what it left for the next one.

    - ``status``: ``ok``; ``error`` (the code raised: ``error`` is its traceback, line-numbered
      against the block; or a ``ReplayDivergenceError``/``SandboxError``); ``limit`` (``limit``
      names it: ``wall_clock 30s``, ``cpu_time 10s``, ``memory 2048MB``, ``file_size 100MB``,
      ``snapshot_size 50MB``, ``processes 64``); ``suspended`` (``pending`` is the external call
      that paused it; ``more_pending`` the calls of the same ``parallel(...)`` that wait with it,
      in call order before it: ``all_pending``).
    - ``snapshot``: the namespace after the block (also after an error, as in a REPL); None when
      the block hit a limit, was suspended, diverged from its journal or died: keep the old one.
      Opaque bytes, only ever loaded by a later sandbox child.
    - ``journal``: the replayed entries then the calls answered in this run, in call order,
      sandbox-side helpers with effects (``FS.*``, ``Bash.execute``) included: a replay returns
      their recorded values instead of running them again.
    - ``duration_ms``: from the block's start on a worker to its outcome (``on_call`` time
      included, waiting for a free worker not).
    - ``figures``: PNG images of the matplotlib figures the block left open (then closed), for
      ``ok`` and ``error`` outcomes: at most 10 of at most 5 MB each, each checked to start with
      the PNG signature (never decoded by the parent).
    - ``failure``: why the runtime ended the block when it did not report its own end (``error``
      or ``limit`` then says it in words); None when it did.
    - ``process``: where it ran: ``fresh`` (a new fork, restoring the snapshot and replaying the
      journal), ``live`` (the process its conversation's last block left live), ``prepared`` (a
      process readied for it while its code was being written: ``RuntimePool.prepare``) or
      ``resumed`` (its own paused block, continued in the process that kept it).
    """

    status: Literal["ok", "error", "limit", "suspended"]
    stdout: str
    results: list[str]
    error: str | None
    limit: str | None
    snapshot: bytes | None
    dropped: list[str]
    journal: list[JournalEntry]
    pending: HelperCall | None
    duration_ms: float
    figures: list[bytes] = Field(default_factory=list)  # PNG images of the figures the block left open
    more_pending: list[HelperCall] = Field(default_factory=list)
    process: BlockProcess = "fresh"
    failure: BlockFailure | None = None

    @property
    def all_pending(self) -> list[HelperCall]:
        """Every external call the block waits on, in call order (one pause carries them all)."""
        return [] if self.pending is None else [*self.more_pending, self.pending]
