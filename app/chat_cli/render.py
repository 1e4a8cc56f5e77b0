"""How ``sabre chat`` shows a turn as its events arrive: the model's prose streamed as it is written,
its ``<helpers>`` code highlighted once the block starts, each block's result when it ends, figures
saved (and drawn inline where the terminal can), and pending external calls with their arguments."""

from __future__ import annotations

import base64
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Literal

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text
from sabre_api.models.event_out import EventOut

OPEN: Final = "<helpers>"
CLOSE: Final = "</helpers>"
ImageProtocol = Literal["kitty", "iterm", "none"]
UNSAFE: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""Characters a terminal obeys instead of showing: C0 and C1 controls but newline and tab (ESC starts
CSI/OSC sequences: clipboard writes, spoofed links, titles, cursor moves), and bidi overrides."""
FILE_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a figure's file id may be before it names a file under the figures directory."""


def printable(text: object) -> str:
    """``text`` with its terminal controls shown as ``\\x1b``/``\\u202e`` (carriage returns dropped):
    the model and the server write what is shown, never a command to the terminal."""
    return UNSAFE.sub(_visible, str(text).replace("\r\n", "\n").replace("\r", ""))


def plain(text: object) -> str:
    """``printable(text)`` for a rich markup string: its brackets are text, not markup."""
    return escape(printable(text))


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def image_protocol() -> ImageProtocol:
    """The inline-image protocol this terminal speaks, if any (kitty's or iTerm2's)."""
    if os.environ.get("KITTY_WINDOW_ID") or os.environ.get("TERM") == "xterm-kitty":
        return "kitty"
    if os.environ.get("TERM_PROGRAM") in ("iTerm.app", "WezTerm"):
        return "iterm"
    return "none"


class ProseFilter:
    """Streamed model text without its ``<helpers>`` blocks (shown apart, highlighted), tags split
    across deltas included."""

    def __init__(self) -> None:
        self._pending = ""
        self._in_block = False

    def feed(self, text: str) -> str:
        """The part of ``text`` (with what was held back) that is prose and can be shown now."""
        data = self._pending + text
        self._pending = ""
        shown: list[str] = []
        while data:
            tag = CLOSE if self._in_block else OPEN
            at = data.find(tag)
            if at >= 0:
                if not self._in_block:
                    shown.append(data[:at])
                data = data[at + len(tag) :]
                self._in_block = not self._in_block
                continue
            # Hold back a tail that could be the start of the tag.
            keep = next((n for n in range(len(tag) - 1, 0, -1) if data.endswith(tag[:n])), 0)
            if not self._in_block:
                shown.append(data[: len(data) - keep])
            self._pending = data[len(data) - keep :] if keep else ""
            break
        return "".join(shown)

    def flush(self) -> str:
        """What is left once the model's message has ended."""
        rest, self._pending = ("" if self._in_block else self._pending), ""
        self._in_block = False
        return rest


class TurnView:
    """Renders one turn's events on a rich console."""

    def __init__(self, console: Console, *, figures: Path, fetch_file: Callable[[str], bytes]) -> None:
        self.console = console
        self.figures = figures
        self.fetch_file = fetch_file
        self.prose = ProseFilter()
        self.at_line_start = True

    def _write(self, text: str) -> None:
        if text:
            self.console.print(Text(printable(text)), end="", soft_wrap=True)
            self.at_line_start = text.endswith("\n")
            self.console.file.flush()

    def _newline(self) -> None:
        if not self.at_line_start:
            self.console.print()
            self.at_line_start = True

    def show(self, event: EventOut) -> None:
        """Show one event."""
        data: dict[str, Any] = event.data.to_dict()
        kind = event.type_
        if kind == "llm.delta":
            self._write(self.prose.feed(str(data.get("text", ""))))
        elif kind == "llm.completed":
            self._write(self.prose.flush())
        elif kind == "block.started":
            self._write(self.prose.flush())
            self._newline()
            code = printable(data.get("code", "")).strip("\n")
            title = "helpers (resumed)" if data.get("resumed") else "helpers"
            self.console.print(Panel(Syntax(code, "python", theme="ansi_dark", word_wrap=True), title=title))
        elif kind == "helper.started":
            self.console.print(Text(f"  → {printable(data.get('name'))}()", style="dim"))
        elif kind == "block.completed":
            self._block_result(data)
        elif kind == "turn.failed":
            self._newline()
            error = data.get("error") or {}
            code, message = plain(error.get("code", "?")), plain(error.get("message", ""))
            self.console.print(f"[red]The turn failed[/red] ({code}): {message}")
        elif kind == "turn.cancelled":
            self._newline()
            self.console.print("[yellow]The turn was cancelled.[/yellow]")
        elif kind in ("turn.completed", "turn.awaiting_tool_results"):
            self._write(self.prose.flush())
            self._newline()

    def _block_result(self, data: dict[str, Any]) -> None:
        status = str(data.get("status", "ok"))
        text = printable(data.get("text", "")).strip("\n")
        style = {"ok": "green", "suspended": "yellow"}.get(status, "red")
        if status != "suspended":
            self.console.print(
                Panel(Text(text or "(no output)"), title=f"result: {plain(status)}", border_style=style)
            )
        for file_id in data.get("files") or []:
            self.figure(str(file_id))

    def figure(self, file_id: str) -> None:
        """Save a figure the block drew, say where, and draw it inline when the terminal can. The id
        names the file, so one that is not an id (``../../x``, ``/etc/x``) is refused."""
        if not FILE_ID.fullmatch(file_id):
            self.console.print(f"[yellow]figure {plain(file_id)}: not an id, not saved[/yellow]")
            return
        try:
            png: bytes = self.fetch_file(file_id)
        except Exception as exc:  # a figure that cannot be fetched must not end the chat
            self.console.print(f"[yellow]figure {file_id}: not fetched ({plain(exc)})[/yellow]")
            return
        self.figures.mkdir(parents=True, exist_ok=True)
        path = self.figures / f"{file_id}.png"
        path.write_bytes(png)
        self.console.print(f"[cyan]figure saved: {plain(path)}[/cyan]")
        protocol = image_protocol()
        if protocol != "none" and self.console.is_terminal:
            sys.stdout.write(inline_image(png, protocol=protocol) + "\n")
            sys.stdout.flush()


def inline_image(png: bytes, *, protocol: ImageProtocol) -> str:
    """The escape sequence that draws ``png`` in a kitty or iTerm2 terminal."""
    data = base64.standard_b64encode(png).decode()
    if protocol == "iterm":
        return f"\x1b]1337;File=inline=1;size={len(png)}:{data}\x07"
    chunks = [data[i : i + 4096] for i in range(0, len(data), 4096)] or [""]
    out = []
    for index, chunk in enumerate(chunks):
        more = 1 if index < len(chunks) - 1 else 0
        head = "a=T,f=100," if index == 0 else ""
        out.append(f"\x1b_G{head}m={more};{chunk}\x1b\\")
    return "".join(out)


def show_pending(console: Console, calls: list[dict[str, Any]]) -> None:
    """The external calls the turn waits for, with their arguments."""
    for call in calls:
        arguments = printable(json.dumps(call.get("arguments", {}), indent=2, ensure_ascii=False))
        body = Syntax(arguments, "json", theme="ansi_dark", word_wrap=True)
        title = f"external call: {plain(call.get('name'))}  [dim]({plain(call.get('id'))})[/dim]"
        console.print(Panel(body, title=title))
