"""The wire format between the pool (parent), a sandbox worker and the worker's forked child.

Every message is a frame: an 8-byte prefix (header length, blob length; big-endian u32), a JSON
header (an object whose "t" tag names the frame) and an optional opaque blob (a namespace
snapshot). The parent only ever decodes JSON: a blob is carried and stored, never unpickled.

Frames, by direction:
- parent -> child: ``run`` (one block; blob = the previous snapshot), ``reply`` (answer to a call);
- child -> parent: ``ready`` (idle, waiting for ``run``), ``call`` (a helper/tool call),
  ``done`` (the block's outcome; blob = the new snapshot);
- worker -> parent: ``exit`` (a child ended; written only after it is dead and reaped).

This module is imported by the worker, so it stays light: no pydantic, no asyncio.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import struct
from collections.abc import Mapping
from typing import Any, Final, Literal

PROTOCOL_VERSION: Final = 1
PREFIX: Final = struct.Struct(">II")
# A header carries stdout, results, an error or a call's arguments. They are capped in the child
# (stdout_bytes) except a call's arguments, which may legitimately be large (a prompt with data).
MAX_HEADER_BYTES: Final = 16 * 1024 * 1024
# Exit code of a child that read EOF instead of a block: the pool is closing, the worker stops.
EXIT_EOF: Final = 75
# The filename blocks are compiled with; tracebacks keep only frames from it.
BLOCK_FILENAME: Final = "<helpers>"

FrameTag = Literal["run", "reply", "ready", "call", "done", "exit"]


class FrameError(Exception):
    """A frame that is malformed, oversized or not what the protocol allows at this point."""


def encode_frame(header: Mapping[str, Any], blob: bytes = b"") -> bytes:
    """Encode one frame: prefix, JSON header, blob (strict JSON: no NaN, ASCII-safe)."""
    data = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    return PREFIX.pack(len(data), len(blob)) + data + blob


def decode_prefix(prefix: bytes, *, max_header: int, max_blob: int) -> tuple[int, int]:
    """Return (header length, blob length), refusing sizes beyond the given caps."""
    header_len, blob_len = PREFIX.unpack(prefix)
    if not 2 <= header_len <= max_header:
        raise FrameError(f"frame header of {header_len} bytes (allowed: up to {max_header})")
    if blob_len > max_blob:
        raise FrameError(f"frame blob of {blob_len} bytes (allowed: up to {max_blob})")
    return header_len, blob_len


def decode_header(data: bytes) -> dict[str, Any]:
    """Decode a JSON header; it must be an object with a string "t" tag."""
    try:
        header = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"frame header is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise FrameError("frame header is not an object with a 't' tag")
    return header


def canonical_json(value: Any) -> str:
    """Canonical JSON (sorted keys, no spaces, repr() for anything JSON cannot hold)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


def call_digest(*, name: str, args: Any, kwargs: Any) -> str:
    """The journal digest of a call: sha256 of the canonical JSON of [name, args, kwargs].

    The child computes it over the JSON values it sends in the call, so the parent can compute
    the same digest from a ``HelperCall`` (to append the answer of a pending call).
    """
    return hashlib.sha256(canonical_json([name, args, kwargs]).encode()).hexdigest()


def to_json(value: Any, *, strict: bool, _depth: int = 0) -> Any:
    """Convert a value the code passed to a helper into JSON values.

    numpy values become their Python equivalent, tuples lists, dates ISO strings. Anything else
    is rendered with repr() (internal helpers: best effort) or refused with TypeError (external
    tools: the caller receives exactly what the code meant, or the code learns it cannot).
    """
    if _depth > 100:
        raise TypeError("value nests too deeply (or contains itself)")
    if value is None or type(value) in (str, int, bool):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        if strict:
            raise TypeError(f"{value!r} is not a JSON number")
        return repr(value)
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list | tuple):
        return [to_json(v, strict=strict, _depth=_depth + 1) for v in value]
    if isinstance(value, dict):
        return {
            _json_key(k, strict=strict): to_json(v, strict=strict, _depth=_depth + 1)
            for k, v in value.items()
        }
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return to_json(value.tolist(), strict=strict, _depth=_depth + 1)
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat) and type(value).__module__ == "datetime":
        return str(isoformat())
    if strict:
        raise TypeError(f"a {type(value).__name__} is not a JSON value")
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


# Blocking helpers for the worker and its child (the parent uses asyncio streams instead).


def read_exact(stream: io.RawIOBase, size: int) -> bytes:
    """Read exactly ``size`` bytes; EOFError if the pipe closes first."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = stream.readinto(view[got:])
        if not n:
            raise EOFError(f"pipe closed after {got} of {size} bytes")
        got += n
    return bytes(buf)


def read_frame(stream: io.RawIOBase) -> tuple[dict[str, Any], bytes]:
    """Read one frame sent by the parent (trusted: sizes are still checked for sanity)."""
    header_len, blob_len = decode_prefix(
        read_exact(stream, PREFIX.size), max_header=1 << 31, max_blob=1 << 32
    )
    header = decode_header(read_exact(stream, header_len))
    return header, read_exact(stream, blob_len) if blob_len else b""


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a blocking fd."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_frame(fd: int, header: Mapping[str, Any], blob: bytes = b"") -> None:
    """Write one frame; the blob is written separately so a large snapshot is not copied."""
    data = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    write_all(fd, PREFIX.pack(len(data), len(blob)) + data)
    if blob:
        write_all(fd, blob)
