"""What a block prints, capped: kept by the worker, never by the block's own process.

The block's fds 1 and 2 are the write end of a pipe whose read end only the worker holds, so the
output of the code, of its subprocesses and of whatever it left running all lands here, and the
block cannot read, rewrite or forge it. The worker keeps the first and the last half of the
limit and counts the rest, so printing 100 MB costs no process 100 MB.

Imported by the sandbox worker: standard library only.
"""

from __future__ import annotations

import collections
import os
from typing import Final

_READ_BYTES: Final = 1 << 16


class Output:
    """Head and tail of a byte stream within ``limit`` bytes, and a count of what was dropped."""

    def __init__(self, limit: int = 1 << 62) -> None:
        self._head = bytearray()
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_len = 0
        self._total = 0
        self._head_cap = self._tail_cap = 0
        self.set_limit(limit)

    def set_limit(self, limit: int) -> None:
        """Keep at most ``limit`` bytes: half from the start, half from the end."""
        self._head_cap = limit // 2
        self._tail_cap = limit - self._head_cap

    def add(self, data: bytes) -> None:
        """Append ``data``; what falls between the head and the tail is only counted."""
        self._total += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail.append(data)
            self._tail_len += len(data)
            while self._tail_len - len(self._tail[0]) >= self._tail_cap:
                self._tail_len -= len(self._tail.popleft())

    def drain(self, fd: int) -> bool:
        """Add what a non-blocking ``fd`` holds now; False once every writer has closed it."""
        while True:
            try:
                data = os.read(fd, _READ_BYTES)
            except BlockingIOError:
                return True
            if not data:
                return False
            self.add(data)

    def text(self) -> str:
        """The kept text, with a note of how many bytes were dropped in the middle."""
        tail = b"".join(self._tail)[-self._tail_cap :] if self._tail and self._tail_cap else b""
        head = bytes(self._head)
        lost = self._total - len(head) - len(tail)
        text = head.decode("utf-8", "replace")
        if lost:
            text += f"\n[... {lost} bytes truncated]\n"
        return text + tail.decode("utf-8", "replace")
