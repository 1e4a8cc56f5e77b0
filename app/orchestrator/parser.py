"""Incremental parser for ``<helpers>`` blocks in a model's streamed answer.

It accepts chunks split anywhere (even inside a tag), keeps the text around blocks, tolerates an
unclosed block at the end of the stream and several blocks in one answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

OPEN = "<helpers>"
CLOSE = "</helpers>"
COMPLETE = "</complete>"


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of prose (``text``) or the code of one block (``block``)."""

    kind: Literal["text", "block"]
    content: str
    closed: bool = True


@dataclass(slots=True)
class HelpersStreamParser:
    """Feed chunks, collect segments; ``close()`` flushes what is left at end of stream."""

    _buffer: str = ""
    _in_block: bool = False
    segments: list[Segment] = field(default_factory=list)

    def feed(self, chunk: str) -> list[Segment]:
        """Consume a chunk; return the segments completed by it."""
        self._buffer += chunk
        produced: list[Segment] = []
        while True:
            tag = CLOSE if self._in_block else OPEN
            index = self._buffer.find(tag)
            if index < 0:
                # Emit what cannot be the start of a tag; keep a possible partial tag buffered.
                keep = _partial_suffix(self._buffer, tag)
                ready, self._buffer = (
                    self._buffer[: len(self._buffer) - keep],
                    self._buffer[len(self._buffer) - keep :],
                )
                if ready and not self._in_block:
                    produced.append(Segment("text", ready))
                elif ready:
                    # Code is only emitted whole, at its closing tag: keep accumulating.
                    self._buffer = ready + self._buffer
                break
            before, self._buffer = self._buffer[:index], self._buffer[index + len(tag) :]
            if self._in_block:
                produced.append(Segment("block", _strip_code(before)))
            elif before:
                produced.append(Segment("text", before))
            self._in_block = not self._in_block
        self.segments.extend(_merge_text(self.segments, produced))
        return produced

    def close(self) -> list[Segment]:
        """End of stream: an open block becomes an unclosed block, leftovers become text."""
        produced: list[Segment] = []
        if self._in_block:
            produced.append(Segment("block", _strip_code(self._buffer), closed=False))
        elif self._buffer:
            produced.append(Segment("text", self._buffer))
        self._buffer = ""
        self._in_block = False
        self.segments.extend(_merge_text(self.segments, produced))
        return produced


def parse(text: str) -> list[Segment]:
    """Parse a whole answer at once."""
    parser = HelpersStreamParser()
    parser.feed(text)
    parser.close()
    return parser.segments


def blocks(segments: list[Segment]) -> list[Segment]:
    """The code segments, in order; empty blocks are skipped."""
    return [s for s in segments if s.kind == "block" and s.content.strip()]


def prose(segments: list[Segment]) -> str:
    """The text outside blocks, with the ``</complete>`` marker removed."""
    text = "".join(s.content for s in segments if s.kind == "text")
    return text.replace(COMPLETE, "").strip()


def _partial_suffix(buffer: str, tag: str) -> int:
    """Length of the longest suffix of ``buffer`` that is a proper prefix of ``tag``."""
    for size in range(min(len(tag) - 1, len(buffer)), 0, -1):
        if buffer.endswith(tag[:size]):
            return size
    return 0


def _strip_code(code: str) -> str:
    """Drop the newline after ``<helpers>`` and trailing whitespace; keep indentation."""
    return code.strip("\n").rstrip()


def _merge_text(existing: list[Segment], produced: list[Segment]) -> list[Segment]:
    """Join adjacent text segments so the parser's record reads like the answer did."""
    merged: list[Segment] = []
    for segment in produced:
        last = merged[-1] if merged else (existing[-1] if existing else None)
        if segment.kind == "text" and last is not None and last.kind == "text":
            joined = Segment("text", last.content + segment.content)
            if merged:
                merged[-1] = joined
            else:
                existing[-1] = joined
            continue
        merged.append(segment)
    return merged
