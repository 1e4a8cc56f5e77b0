"""The block's output: ``print`` to the pipe the worker reads and caps, and ``result()`` values
within a byte budget."""

from __future__ import annotations

import io
import json
from typing import Final

from app.runtime.protocol import (
    write_all,
)

_WRITE_SLICE: Final = 1 << 20


class OutputStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of the block: text written to fd 1, a pipe the worker reads
    and caps (``app.runtime.output``). Line-buffered, so what the code prints and what its
    subprocesses write to the same pipe keep their order. ``fd=None`` (the warm-up) discards."""

    encoding = "utf-8"
    errors = "backslashreplace"

    def __init__(self, fd: int | None) -> None:
        super().__init__()
        self._fd = fd
        self._pending = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, text: str, /) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self._fd is None:
            return len(text)
        # A huge string is encoded a slice at a time, never as one more huge copy.
        for start in range(0, len(text), _WRITE_SLICE):
            self._pending += text[start : start + _WRITE_SLICE].encode("utf-8", "backslashreplace")
            if len(self._pending) >= _WRITE_SLICE:
                self.flush()
        if "\n" in text:
            self.flush()
        return len(text)

    def flush(self) -> None:
        if self._pending and self._fd is not None:
            data, self._pending = bytes(self._pending), bytearray()
            write_all(self._fd, data)

    def fileno(self) -> int:
        # fd 1 is the capture pipe too, so code that writes to the fd is captured as well.
        return 1


class Results:
    """What ``result()`` got, rendered, within a byte budget (the frame must stay bounded)."""

    def __init__(self, budget: int) -> None:
        self.items: list[str] = []
        self._left = budget
        self._lost = 0

    def add(self, text: str) -> None:
        if self._left <= 0:
            self._lost += 1
            return
        self.items.append(cap_text(text, self._left))
        self._left -= len(text.encode("utf-8", "surrogatepass"))

    def rendered(self) -> list[str]:
        if self._lost:
            return [*self.items, f"[... {self._lost} more results truncated]"]
        return self.items


def cap_text(text: str, limit: int) -> str:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    kept = data[:limit].decode("utf-8", "ignore")
    return f"{kept}\n[... {len(data) - limit} bytes truncated]"


def render_result(value: object) -> str:
    """str as is; JSON containers as JSON; anything else as repr()."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list | tuple):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            pass
    return repr(value)
