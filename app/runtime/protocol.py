"""The wire format between the pool (parent), a sandbox worker and the worker's forked child.

Every message is a frame: an 8-byte prefix (header length, blob length; big-endian u32), a JSON
header (an object whose "t" tag names the frame) and an optional opaque blob (a namespace
snapshot). The parent only ever decodes JSON: a blob is carried and stored, never unpickled.

Frames, by direction (header fields after the tag):
- child -> parent ``ready {pid}``: forked, warmed up, waiting for its block;
- parent -> child ``run {v, code, workdir, limits, helpers, tools, journal}``, blob = the
  snapshot to restore; ``journal`` entries are ``[name, digest, value]`` or, for a call that
  raised, ``[name, digest, null, error_type, error_message]``;
- child -> parent ``call {digest, call, batch?}`` (a ``HelperCall``: ``runs`` says who runs it), answered by
  parent -> child ``reply {kind, value, error_type, error_message}`` (a ``CallReply``);
  ``batch: [index, size]`` marks the calls of one ``parallel(...)`` (external tools only, sent in
  order, nothing else in between): an external call of a batch that would pause is answered
  ``deferred`` and the next one follows; the last one is answered ``suspend`` when any of the
  batch waits, so one pause carries them all;
- child -> parent ``record {name, digest, value, error_type, error_message}``, one-way: a
  sandbox-side helper (``FS.write_file``, ``Bash.execute``, ...) ran in the child; the parent appends
  it to the block's journal, in call order with the calls, so a replay returns the recorded value
  instead of running it again;
- child -> parent ``done {status, stdout, results, error, limit, dropped, replayed, figures}``,
  blob = the new snapshot followed by the PNG images of the figures the block left open
  (``figures`` lists their sizes, in order); then the child exits;
- worker -> parent ``exit {pid, code, signal, cpu_seconds}``: a child ended (written only once it
  is dead and reaped, so nothing of the child can follow it).

This module is imported by the worker, so it stays light: no pydantic, no asyncio.
"""

from __future__ import annotations

import hashlib
import io
import json
import json.encoder
import math
import os
import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, NotRequired, TypedDict, cast

PROTOCOL_VERSION: Final = 3
PREFIX: Final = struct.Struct(">II")
# A header carries stdout, results, an error or a call's arguments. They are capped in the child
# (stdout_bytes) except a call's arguments, which may legitimately be large (a prompt with data).
MAX_HEADER_BYTES: Final = 16 * 1024 * 1024
# Exit code of a child that read EOF instead of a block: the pool is closing, the worker stops.
EXIT_EOF: Final = 75
# A live process (one that stays bound to its conversation after a block: ``keep`` in the run
# request, ``live`` in its done) runs at most this many blocks, then a fresh fork takes over (its
# hard RLIMIT_CPU leaves room for this many blocks' budgets). A rollover costs a fresh block (a
# fork, its exit and the namespace restored from the snapshot, ~12 ms of CPU with the default
# preloads): at 64 that was a sixth of a live block's cost, 1,670 against 1,960 trivial blocks/s
# on two conversations at 256 (bench/runtime_bench.py's live rows).
LIVE_MAX_BLOCKS: Final = 256
# Names the runtime puts in every block's namespace: no helper or tool may take them.
RESERVED_NAMES: Final = frozenset({"result", "parallel", "ToolError", "print"})
# Who runs a helper or tool: one word set for helpers, tools, personas and the runtime. The
# service (a helper such as llm_call, an MCP tool), the sandbox (FS.*, a persona's Python tool:
# next to the code) or the caller (an external tool: calling one pauses the turn).
Runner = Literal["service", "sandbox", "caller"]
# Who runs a call the code makes that leaves the sandbox.
CallRunner = Literal["service", "caller"]
# The filename blocks are compiled with; tracebacks keep only frames from it.
BLOCK_FILENAME: Final = "<helpers>"

# Helpers that run in the child itself (``app.runtime.library``), present in every block. The
# journaled ones have effects or read state, so a replayed block gets their recorded value;
# ``pandas_bind`` only builds a value (its ``.ask`` goes through the journaled ``llm_call``).
JOURNALED_SANDBOX_HELPERS: Final = frozenset(
    {"FS.read_file", "FS.write_file", "FS.list_files", "Bash.execute"}
)
SANDBOX_HELPERS: Final = JOURNALED_SANDBOX_HELPERS | {"pandas_bind"}
# The namespace objects of the dotted sandbox helpers (``FS``, ``Bash``).
SANDBOX_GROUPS: Final = frozenset(name.split(".", 1)[0] for name in SANDBOX_HELPERS if "." in name)
# A ``record`` frame beyond this is refused in the child (the call raises instead): the journal is
# stored with the conversation.
MAX_RECORD_BYTES: Final = 8 * 1024 * 1024
# What one block may send in all, checked in the child (the call raises), by the worker and by
# the parent (a block past them is killed as hostile): record frames and their bytes, calls.
MAX_RECORDS: Final = 10_000
MAX_JOURNAL_BYTES: Final = 32 * 1024 * 1024
MAX_CALLS: Final = 10_000
# External calls one ``parallel(...)`` may send in one batch (so one pause lists at most this many).
MAX_PARALLEL_CALLS: Final = 128

# Figures of one block: at most this many, each a PNG of at most this size.
MAX_FIGURES: Final = 10
MAX_FIGURE_BYTES: Final = 5 * 1024 * 1024
PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"

LimitKind = Literal[
    "wall_clock", "cpu_time", "memory", "file_size", "snapshot_size", "processes", "disk", "disk_files"
]


# A journal entry on the wire: ``[name, digest, value]`` or, for a call that raised,
# ``[name, digest, None, error_type, error_message]`` (compact: a resume may carry hundreds).
# ``schemas.JournalEntry.to_wire`` writes it; the child reads it.
WireEntry = list[Any]
# A persona's Python tool on the wire: ``[name, params, file, function, source]``.
WireTool = tuple[str, list[str], str, str, str]


class WireLimits(TypedDict):
    """A block's limits on the wire: ``schemas.Limits`` as a plain dict (the child has no pydantic)."""

    cpu_seconds: float
    memory_mb: int
    wall_clock_seconds: float
    max_processes: int
    file_size_mb: int
    open_files: int
    stdout_bytes: int
    snapshot_bytes: int
    disk_mb: int
    disk_files: int


class RunRequest(TypedDict):
    """The ``run`` frame's header: one block for a child (its blob: the snapshot to restore).

    ``helpers`` are the names the service runs, ``tools`` the caller's (name -> parameters),
    ``local_tools`` the sandbox's own; ``keep`` asks the process to stay live after the block;
    ``live`` and ``pid`` address the live process of the conversation (no snapshot then);
    ``prepare``: no code yet, the process only restores the snapshot and stays live, ready for
    the conversation's next block (``RuntimePool.prepare``)."""

    t: Literal["run"]
    v: int
    code: str
    workdir: str
    limits: WireLimits
    helpers: list[str]
    tools: dict[str, list[str]]
    journal: list[WireEntry]
    # ``journal_bytes(journal)``, measured once by the server: the worker and the child count
    # the block's records and answers from it instead of encoding the journal again each.
    journal_bytes: int
    local_tools: list[WireTool]
    keep: bool
    live: NotRequired[bool]
    pid: NotRequired[int]
    prepare: NotRequired[bool]


def run_request(
    *,
    code: str,
    workdir: str,
    limits: WireLimits,
    helpers: Sequence[str] = (),
    tools: Mapping[str, Sequence[str]] | None = None,
    journal: Sequence[WireEntry] = (),
    replayed_bytes: int | None = None,
    local_tools: Sequence[WireTool] = (),
    keep: bool = False,
    live_pid: int | None = None,
    prepare: bool = False,
) -> RunRequest:
    """The one place a ``run`` header is built (the pool's blocks and the worker's warm-up);
    ``replayed_bytes``: ``journal_bytes(journal)`` when the caller measured it already."""
    request: RunRequest = {
        "t": "run",
        "v": PROTOCOL_VERSION,
        "code": code,
        "workdir": workdir,
        "limits": limits,
        "helpers": list(helpers),
        "tools": {name: list(params) for name, params in (tools or {}).items()},
        "journal": list(journal),
        "journal_bytes": journal_bytes(journal) if replayed_bytes is None else replayed_bytes,
        "local_tools": list(local_tools),
        "keep": keep,
    }
    if live_pid is not None:
        request["live"] = True
        request["pid"] = live_pid
    if prepare:
        request["prepare"] = True
    return request


def as_run_request(header: Mapping[str, Any]) -> RunRequest:
    """A decoded header as a ``RunRequest`` once its tag and version are checked (it comes from
    the server through the worker: trusted, but never of another protocol version)."""
    if header.get("t") != "run" or header.get("v") != PROTOCOL_VERSION:
        raise FrameError(
            f"sandbox protocol: expected a run request of version {PROTOCOL_VERSION}, "
            f"got {header.get('t')!r} (version {header.get('v')!r})"
        )
    if type(header.get("journal_bytes")) is not int or header["journal_bytes"] < 0:
        raise FrameError("sandbox protocol: a run request without its journal's measure")
    return cast(RunRequest, header)


class FrameError(Exception):
    """A frame that is malformed, oversized or not what the protocol allows at this point."""


def journal_bytes(journal: Sequence[WireEntry]) -> int:
    """What a journal weighs against ``MAX_JOURNAL_BYTES``: its entries' JSON as the wire carries it.

    A resumed block's run counts the journal it replays first, in the child, the worker and the
    parent alike (one measure, so they agree): its new records, and the new answers to its calls,
    may each add only what is left below the cap. So a block that paused and resumed many times
    keeps a journal of at most twice the cap, where each run used to add up to the cap again.
    """
    return sum(len(_STRICT.encode(entry)) for entry in journal)


def encode_frame(header: Mapping[str, Any], blob: bytes = b"") -> bytes:
    """Encode one frame: prefix, JSON header, blob (strict JSON: no NaN, ASCII-safe)."""
    data = _STRICT.encode(header).encode()
    return PREFIX.pack(len(data), len(blob)) + data + blob


def decode_prefix(prefix: bytes, *, max_header: int, max_blob: int) -> tuple[int, int]:
    """Return (header length, blob length), refusing sizes beyond the given caps."""
    header_len, blob_len = PREFIX.unpack(prefix)
    if not 2 <= header_len <= max_header:
        raise FrameError(f"frame header of {header_len} bytes (allowed: up to {max_header})")
    if blob_len > max_blob:
        raise FrameError(f"frame blob of {blob_len} bytes (allowed: up to {max_blob})")
    return header_len, blob_len


def decode_header(data: bytes | bytearray) -> dict[str, Any]:
    """Decode a JSON header (UTF-8, strict JSON: no NaN or Infinity, which the worker could not
    encode again); it must be an object with a string "t" tag."""
    try:
        header = _DECODER.decode(data.decode())
        if _SURROGATE_ESCAPE.search(data) is not None:
            header = _without_lone_surrogates(header)
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"frame header is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise FrameError("frame header is not an object with a 't' tag")
    return header


def _without_lone_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate (a \\udXXX escape JSON decodes on its own, which a
    block may send in a result, an error or a call) replaced by U+FFFD: no UTF-8 encoder takes
    one, so it would fail every later use of the text (the model's request with the transcript,
    a response carrying it)."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_lone_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_without_lone_surrogates(key): _without_lone_surrogates(item) for key, item in value.items()}
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_STRICT: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant)
# A surrogate's escape (the decoder pairs those that make a pair): the walk above only then.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_CANONICAL: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), default=repr, check_circular=False
)
# The same encoder made once: JSONEncoder.encode builds it anew on every call, which is most of
# the cost of a digest, and every replayed call computes one.
_make_encoder = getattr(json.encoder, "c_make_encoder", None)  # the C accelerator, if present
_canonical_chunks = (
    _make_encoder(None, repr, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True)
    if _make_encoder is not None
    else None
)


def canonical_json(value: Any) -> str:
    """Canonical JSON (sorted keys, no spaces, repr() for anything JSON cannot hold)."""
    if _canonical_chunks is not None and type(value) in (list, dict):
        return "".join(_canonical_chunks(value, 0))
    return _CANONICAL.encode(value)


def bind_params(
    name: str, params: Sequence[str], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """A tool call's arguments by parameter name: positional ones in ``params`` order, then the
    keywords; TypeError (as Python words it) for too many or a doubled argument."""
    if len(args) > len(params):
        raise TypeError(f"{name}() takes {len(params)} positional arguments but {len(args)} were given")
    bound = dict(zip(params, args, strict=False))
    for key, value in kwargs.items():
        if key in bound:
            raise TypeError(f"{name}() got multiple values for argument {key!r}")
        bound[key] = value
    return bound


def call_digest(*, name: str, args: Any, kwargs: Any) -> str:
    """The journal digest of a call: sha256 of the canonical JSON of [name, args, kwargs].

    The child computes it over the JSON values it sends in the call, so the parent can compute
    the same digest from a ``HelperCall`` (to append the answer of a pending call).
    """
    return hashlib.sha256(canonical_json([name, args, kwargs]).encode()).hexdigest()


_ATOMS: Final = frozenset({str, int, bool, type(None)})


def to_json(value: Any, *, strict: bool, _depth: int = 0) -> Any:
    """Convert a value the code passed to a helper into JSON values.

    numpy values become their Python equivalent, tuples lists, dates ISO strings. Anything else
    is rendered with repr() (internal helpers: best effort) or refused with TypeError (external
    tools: the caller receives exactly what the code meant, or the code learns it cannot).
    """
    kind = type(value)
    if kind in _ATOMS:
        return value
    if _depth > 100:
        raise TypeError("value nests too deeply (or contains itself)")
    # Exact types first: this runs for every argument of every call, replayed ones included.
    if kind is list or kind is tuple:
        return [v if type(v) in _ATOMS else to_json(v, strict=strict, _depth=_depth + 1) for v in value]
    if kind is dict:
        return {
            (k if type(k) is str else _json_key(k, strict=strict)): (
                v if type(v) in _ATOMS else to_json(v, strict=strict, _depth=_depth + 1)
            )
            for k, v in value.items()
        }
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        if strict:
            raise TypeError(f"{value!r} is not a JSON number")
        return repr(value)
    if isinstance(value, int):  # IntEnum and other int subclasses
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):  # subclasses: OrderedDict, defaultdict, ...
        return to_json(dict(value), strict=strict, _depth=_depth + 1)
    if isinstance(value, list | tuple):  # namedtuples, ...
        return to_json(list(value), strict=strict, _depth=_depth + 1)
    if kind.__module__ == "numpy" and hasattr(value, "tolist"):
        return to_json(value.tolist(), strict=strict, _depth=_depth + 1)
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat) and kind.__module__ == "datetime":
        return str(isoformat())
    if strict:
        raise TypeError(f"a {kind.__name__} is not a JSON value")
    return repr(value)


def _json_key(key: Any, *, strict: bool) -> str:
    """Dict keys the way json.dumps converts them (so digests agree on both sides)."""
    if isinstance(key, str):
        return str(key)
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(key)
    if strict:
        raise TypeError(f"a {type(key).__name__} dict key is not a JSON object key")
    return repr(key)


def limit_label(kind: LimitKind, limits: Mapping[str, Any]) -> str:
    """The ``limit`` text of an outcome, e.g. ``memory 2048MB``."""
    match kind:
        case "wall_clock":
            return f"wall_clock {float(limits['wall_clock_seconds']):g}s"
        case "cpu_time":
            return f"cpu_time {float(limits['cpu_seconds']):g}s"
        case "memory":
            return f"memory {limits['memory_mb']}MB"
        case "file_size":
            return f"file_size {limits['file_size_mb']}MB"
        case "snapshot_size":
            return f"snapshot_size {int(limits['snapshot_bytes']) / 1e6:g}MB"
        case "processes":
            return f"processes {limits['max_processes']}"
        case "disk":
            return f"disk {limits['disk_mb']}MB"
        case "disk_files":
            return f"disk_files {limits['disk_files']}"


# Blocking helpers for the worker and its child (the parent uses asyncio streams instead).


def read_exact(stream: io.RawIOBase, size: int) -> bytes:
    """Read exactly ``size`` bytes; EOFError if the pipe closes first."""
    buf = bytearray(size)
    _read_into(stream, memoryview(buf))
    return bytes(buf)


def _read_into(stream: io.RawIOBase, view: memoryview) -> None:
    """Fill ``view`` from ``stream``; EOFError if the pipe closes first."""
    got, size = 0, len(view)
    while got < size:
        n = stream.readinto(view[got:])
        if not n:
            raise EOFError(f"pipe closed after {got} of {size} bytes")
        got += n


def read_frame(stream: io.RawIOBase) -> tuple[dict[str, Any], bytes]:
    """Read one frame sent by the parent (trusted: sizes are still checked for sanity)."""
    header_len, blob_len = decode_prefix(
        read_exact(stream, PREFIX.size), max_header=1 << 31, max_blob=1 << 32
    )
    header = decode_header(read_exact(stream, header_len))
    return header, read_exact(stream, blob_len) if blob_len else b""


def read_frame_bytes(stream: io.RawIOBase) -> tuple[dict[str, Any], bytearray, int]:
    """Read one frame sent by the parent as its decoded header, the whole frame's bytes and the
    size of its blob: what the worker passes on to its child unchanged, never encoded again."""
    prefix = read_exact(stream, PREFIX.size)
    header_len, blob_len = decode_prefix(prefix, max_header=1 << 31, max_blob=1 << 32)
    frame = bytearray(PREFIX.size + header_len + blob_len)
    frame[: PREFIX.size] = prefix
    _read_into(stream, memoryview(frame)[PREFIX.size :])
    return decode_header(frame[PREFIX.size : PREFIX.size + header_len]), frame, blob_len


def write_all(fd: int, data: bytes | bytearray) -> None:
    """Write all of ``data`` to a blocking fd."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_frame(fd: int, header: Mapping[str, Any], blob: bytes = b"", more: Sequence[bytes] = ()) -> None:
    """Write one frame whose blob is ``blob`` then each of ``more``; the parts are written
    separately so a large snapshot is not copied."""
    data = _STRICT.encode(header).encode()
    write_all(fd, PREFIX.pack(len(data), len(blob) + sum(map(len, more))) + data)
    for part in (blob, *more):
        if part:
            write_all(fd, part)
