"""A block's exception as the model sees it: only the frames of its own code, line-numbered
against the block's source."""

from __future__ import annotations

import types

from app.runtime.protocol import (
    BLOCK_FILENAME,
)


def _block_codes(code: types.CodeType) -> set[types.CodeType]:
    """The code object of a block and every function/class body compiled with it."""
    found = {code}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _block_codes(const)
    return found


class Source:
    """The block's source lines, to render a line number as ``line N: <source>``."""

    def __init__(self, code: str, compiled: types.CodeType | None) -> None:
        self.lines = code.splitlines()
        self.codes = _block_codes(compiled) if compiled is not None else set()

    def line(self, lineno: int) -> str:
        if 1 <= lineno <= len(self.lines):
            return self.lines[lineno - 1].strip()
        return ""

    def describe(self, code: types.CodeType, lineno: int) -> str:
        where = "" if code.co_name == "<module>" else f" in {code.co_name}"
        if code in self.codes:
            return f"line {lineno}{where}: {self.line(lineno)}"
        return f"line {lineno}{where} (a function from an earlier block)"


def _exception_text(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:
        message = "<str() of the exception failed>"
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


def render_traceback(exc: BaseException, source: Source) -> str:
    """``Traceback (line N): Type: message`` then the block's frames, outermost first.

    Only frames of the block are shown (not the runtime's, not libraries'); a run of identical
    frames (recursion) is folded as Python does.
    """
    if isinstance(exc, SyntaxError) and exc.filename == BLOCK_FILENAME and exc.lineno:
        return (
            f"Traceback (line {exc.lineno}): {type(exc).__name__}: {exc.msg}\n"
            f"  line {exc.lineno}: {source.line(exc.lineno)}"
        )
    frames: list[str] = []
    last_line: int | None = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == BLOCK_FILENAME:
            frames.append("  " + source.describe(tb.tb_frame.f_code, tb.tb_lineno))
            last_line = tb.tb_lineno
        tb = tb.tb_next
    head = "Traceback" if last_line is None else f"Traceback (line {last_line})"
    lines = [f"{head}: {_exception_text(exc)}"]
    repeats = 0
    for index, text in enumerate(frames):
        repeats = repeats + 1 if index and text == frames[index - 1] else 0
        if repeats < 3:
            lines.append(text)
        if repeats >= 3 and (index + 1 == len(frames) or frames[index + 1] != text):
            lines.append(f"  [previous line repeated {repeats - 2} more times]")
    return "\n".join(lines)
