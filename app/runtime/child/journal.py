"""Replaying a block's journal: the recorded answer of a call (``WireEntry``), or its error raised
again, and the short form of a call's arguments for a divergence message."""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping, Sequence
from typing import Any

from app.runtime.child.namespace import ToolError


def short_args(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """Short ``1, "x", key=2`` text of a call's JSON arguments, for error messages."""
    parts = [json.dumps(a)[:80] for a in args]
    parts += [f"{k}={json.dumps(v)[:80]}" for k, v in kwargs.items()]
    return ", ".join(parts)


def answer(entry: Sequence[Any]) -> Any:
    """The value of a journal entry (wire form), or its error raised as ToolError."""
    if len(entry) > 3:
        raise ToolError(str(entry[4] or ""), entry[3])
    return entry[2]


def local_answer(entry: Sequence[Any]) -> Any:
    """The recorded value of a sandbox helper, or its recorded error raised again: as the
    built-in exception it was (``FileNotFoundError``, ...) when it was one, else as ToolError."""
    if len(entry) <= 3:
        return entry[2]
    error_type, message = str(entry[3]), str(entry[4] or "")
    cls = getattr(builtins, error_type, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls is not MemoryError:
        try:
            error = cls(message)
        except Exception:  # an exception type that needs other arguments
            pass
        else:
            raise error
    raise ToolError(message, error_type)
