"""The two tools the agent gets, run by the runner in the instance's checkout.

``bash``: one command in a fresh ``bash -c`` whose working directory is the checkout, with a clean
environment, a time limit (the whole process group is killed) and an output cap (head and tail kept).
``str_replace_editor``: SWE-agent's editor (``view``, ``create``, ``str_replace``, ``insert``,
``undo_edit``) confined to the checkout. A failed edit raises ``ToolFailure`` with a message for the
model; the runner sends it as the call's ``error``, so the model's code gets a ``ToolError``.

Everything a call carries comes from the model and is hostile: paths are resolved and must stay in the
checkout (symlinks included), sizes are bounded. The commands themselves run with the runner's user
rights: run the runner in a container or VM, as SWE-bench's own harness does. A toolbox makes the
runner's process undumpable first, so they cannot read its key in ``/proc/<runner>/environ`` or ``mem``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SNIPPET_LINES: Final = 4
"""Lines of context shown around an edit."""
MAX_FILE_BYTES: Final = 5_000_000
"""The editor refuses to load bigger files (a model opening a data blob gets an error, not 5 GB)."""
ENV_KEEP: Final = ("PATH", "LANG", "LC_ALL", "TERM", "TZ", "VIRTUAL_ENV", "PYTHONPATH", "CONDA_PREFIX")
"""What of the runner's environment a command sees; never the SABRE key or other secrets."""

BASH_SCHEMA: Final[dict[str, Any]] = {
    "type": "function",
    "name": "bash",
    "description": (
        "Run a bash command in the repository checkout (the working directory is the repository root; "
        "each call starts a fresh shell, so `cd` does not carry over). Returns stdout and stderr "
        "interleaved, then `[exit code N]` when it is not 0. Long outputs are cut in the middle; "
        "commands are killed after a time limit."
    ),
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The bash command to run."}},
        "required": ["command"],
        "additionalProperties": False,
    },
}
EDITOR_SCHEMA: Final[dict[str, Any]] = {
    "type": "function",
    "name": "str_replace_editor",
    "description": (
        "View, create and edit files of the repository checkout. `view` shows a file with line numbers "
        "(or a directory two levels deep); `create` writes a new file (refused when it exists); "
        "`str_replace` replaces `old_str`, which must occur exactly once, by `new_str`; `insert` puts "
        "`new_str` after line `insert_line` (0: at the top); `undo_edit` reverts the file's last edit. "
        "Paths are relative to the repository root (or absolute inside it). A failed command raises "
        "ToolError saying why."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
            "path": {"type": "string"},
            "file_text": {"type": "string", "description": "create: the file's content."},
            "old_str": {"type": "string", "description": "str_replace: the exact text to replace."},
            "new_str": {"type": "string", "description": "str_replace and insert: the new text."},
            "insert_line": {"type": "integer", "minimum": 0},
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "minItems": 2,
                "maxItems": 2,
                "description": "view: [first, last] line, 1-based; last -1 for the end.",
            },
        },
        "required": ["command", "path"],
        "additionalProperties": False,
    },
}
TOOL_SCHEMAS: Final = [BASH_SCHEMA, EDITOR_SCHEMA]


class ToolFailure(Exception):
    """A call that could not be carried out; its message goes back to the model as the call's error."""


@dataclass(frozen=True)
class ToolLimits:
    """How long a command may run and how much output a call may return."""

    timeout: float = 120.0
    output_bytes: int = 200_000


class _BashArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str = Field(min_length=1, max_length=100_000)


class _EditorArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: Literal["view", "create", "str_replace", "insert", "undo_edit"]
    path: str = Field(min_length=1, max_length=4_096)
    file_text: str | None = Field(default=None, max_length=MAX_FILE_BYTES)
    old_str: str | None = Field(default=None, max_length=MAX_FILE_BYTES)
    new_str: str | None = Field(default=None, max_length=MAX_FILE_BYTES)
    insert_line: int | None = Field(default=None, ge=0)
    view_range: list[int] | None = Field(default=None, min_length=2, max_length=2)


@dataclass
class Toolbox:
    """The tools of one instance: its checkout, its limits, the editor's undo history."""

    root: Path
    limits: ToolLimits = field(default_factory=ToolLimits)
    _history: dict[Path, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = self.root.resolve()
        hide_this_process()

    async def run(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one call; ``ToolFailure`` for an unknown tool, bad arguments or a failed edit."""
        try:
            if name == "bash":
                return await self.bash(_BashArgs.model_validate(arguments).command)
            if name == "str_replace_editor":
                args = _EditorArgs.model_validate(arguments)
                return await asyncio.to_thread(self.edit, args)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "arguments"
            raise ToolFailure(f"{name}: {where}: {first['msg']}") from None
        raise ToolFailure(f"unknown tool {name!r}: this runner has bash and str_replace_editor")

    # -- bash ---------------------------------------------------------------------------------------

    async def bash(self, command: str) -> str:
        """Run ``command`` in the checkout; the output (capped) and a trailer for a failure."""
        env = {key: os.environ[key] for key in ENV_KEEP if key in os.environ}
        env.update(HOME=str(self.root), GIT_PAGER="cat", PAGER="cat", PYTHONDONTWRITEBYTECODE="1")
        process = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            command,
            cwd=self.root,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group: a timeout kills everything it started
        )
        assert process.stdout is not None
        capture = _Capture(self.limits.output_bytes)
        reader = asyncio.create_task(capture.drain(process.stdout))
        timed_out = False
        try:
            await asyncio.wait_for(process.wait(), timeout=self.limits.timeout)
        except TimeoutError:
            timed_out = True
        finally:
            _kill_group(process.pid)  # also what a finished command left running in the background
            await process.wait()
        # A grandchild that left the group may hold the pipe open: do not wait for it forever.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), timeout=2.0)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        text = capture.text()
        if timed_out:
            return f"{text}\n[timed out after {self.limits.timeout:g} s: the command was killed]"
        if process.returncode:
            return f"{text}\n[exit code {process.returncode}]"
        return text

    # -- str_replace_editor -------------------------------------------------------------------------

    def edit(self, args: _EditorArgs) -> str:
        """One editor command (runs in a thread: it reads and writes files)."""
        path = self._resolve(args.path)
        if args.command == "view":
            return self._cap(self._view(path, args.view_range))
        if args.command == "create":
            return self._create(path, args.file_text)
        if args.command == "str_replace":
            return self._str_replace(path, args.old_str, args.new_str or "")
        if args.command == "insert":
            return self._insert(path, args.insert_line, args.new_str)
        return self._undo(path)

    def _resolve(self, raw: str) -> Path:
        candidate = Path(raw)
        if not candidate.is_absolute():
            candidate = self.root / candidate
        resolved = candidate.resolve()
        if not resolved.is_relative_to(self.root):
            raise ToolFailure(f"{raw}: outside the repository ({self.root})")
        if ".git" in resolved.relative_to(self.root).parts:
            raise ToolFailure(f"{raw}: the editor does not touch .git")
        return resolved

    def _shown(self, path: Path) -> str:
        return str(path.relative_to(self.root)) if path != self.root else "."

    def _read(self, path: Path) -> str:
        if not path.exists():
            raise ToolFailure(f"{self._shown(path)}: no such file")
        if not path.is_file():
            raise ToolFailure(f"{self._shown(path)}: not a regular file")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ToolFailure(f"{self._shown(path)}: larger than {MAX_FILE_BYTES:,} bytes; use bash")
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ToolFailure(f"{self._shown(path)}: not a UTF-8 text file; use bash") from None

    def _write(self, path: Path, text: str, *, before: str | None) -> None:
        if before is not None:
            self._history.setdefault(path, []).append(before)
        path.write_text(text, encoding="utf-8")

    def _view(self, path: Path, view_range: list[int] | None) -> str:
        if path.is_dir():
            if view_range is not None:
                raise ToolFailure("view_range applies to files, not directories")
            return self._listing(path)
        lines = self._read(path).split("\n")
        first, last = 1, len(lines)
        if view_range is not None:
            first, last = view_range
            if not 1 <= first <= len(lines):
                raise ToolFailure(f"view_range: first line {first} is not in 1..{len(lines)}")
            if last == -1:
                last = len(lines)
            elif not first <= last <= len(lines):
                raise ToolFailure(f"view_range: last line {last} is not in {first}..{len(lines)} (or -1)")
        return _numbered(lines[first - 1 : last], start=first)

    def _listing(self, path: Path) -> str:
        entries: list[str] = []
        base_depth = len(path.parts)
        for directory, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            current = Path(directory)
            if len(current.parts) - base_depth >= 2:
                dirs[:] = []
            for name in [*dirs, *sorted(f for f in files if not f.startswith("."))]:
                entries.append(self._shown(current / name) + ("/" if name in dirs else ""))
        return "\n".join(entries)

    def _create(self, path: Path, file_text: str | None) -> str:
        if file_text is None:
            raise ToolFailure("create needs file_text")
        if path.exists():
            raise ToolFailure(f"{self._shown(path)}: already exists; create does not overwrite (edit it)")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._write(path, file_text, before=None)
        return f"created {self._shown(path)} ({len(file_text.splitlines())} lines)"

    def _str_replace(self, path: Path, old: str | None, new: str) -> str:
        if not old:
            raise ToolFailure("str_replace needs a non-empty old_str")
        text = self._read(path)
        count = text.count(old)
        if count == 0:
            raise ToolFailure(
                f"no replacement was made: old_str did not appear verbatim in {self._shown(path)} "
                "(check whitespace and indentation; view the file)"
            )
        if count > 1:
            at, lines = 0, []
            for _ in range(count):
                at = text.index(old, at)
                lines.append(text.count("\n", 0, at) + 1)
                at += 1
            raise ToolFailure(
                f"no replacement was made: old_str occurs {count} times in {self._shown(path)} "
                f"(lines {', '.join(map(str, lines))}); include more context to make it unique"
            )
        at = text.index(old)
        updated = text.replace(old, new, 1)
        self._write(path, updated, before=text)
        line = text.count("\n", 0, at)
        return f"edited {self._shown(path)}:\n" + self._snippet(updated, line, new.count("\n") + 1)

    def _insert(self, path: Path, insert_line: int | None, new: str | None) -> str:
        if insert_line is None or new is None:
            raise ToolFailure("insert needs insert_line and new_str")
        text = self._read(path)
        lines = text.split("\n")
        if insert_line > len(lines):
            raise ToolFailure(f"insert_line {insert_line} is not in 0..{len(lines)}")
        updated = "\n".join([*lines[:insert_line], *new.split("\n"), *lines[insert_line:]])
        self._write(path, updated, before=text)
        return f"edited {self._shown(path)}:\n" + self._snippet(updated, insert_line, new.count("\n") + 1)

    def _undo(self, path: Path) -> str:
        history = self._history.get(path)
        if not history:
            raise ToolFailure(f"{self._shown(path)}: no edit to undo")
        path.write_text(history.pop(), encoding="utf-8")
        return f"reverted the last edit of {self._shown(path)}"

    def _snippet(self, text: str, line: int, count: int) -> str:
        lines = text.split("\n")
        first = max(0, line - SNIPPET_LINES)
        last = min(len(lines), line + count + SNIPPET_LINES)
        return _numbered(lines[first:last], start=first + 1)

    def _cap(self, text: str) -> str:
        data = text.encode("utf-8")
        if len(data) <= self.limits.output_bytes:
            return text
        kept = data[: self.limits.output_bytes].decode("utf-8", errors="ignore")
        return f"{kept}\n[cut at {self.limits.output_bytes:,} of {len(data):,} bytes: use view_range]"


PR_SET_DUMPABLE: Final = 4


def hide_this_process() -> None:
    """Make this process undumpable (Linux): its ``/proc`` environ and memory, which hold the SABRE
    key, become unreadable to other processes of its user, the commands it runs for the model included
    (an exec makes them dumpable again: they are not affected otherwise)."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _numbered(lines: list[str], *, start: int) -> str:
    return "\n".join(f"{number:6}\t{line}" for number, line in enumerate(lines, start=start))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class _Capture:
    """Keeps the first and last halves of a stream within a byte budget, and counts the rest."""

    def __init__(self, budget: int) -> None:
        self.budget = max(budget, 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    async def drain(self, stream: asyncio.StreamReader) -> None:
        half = self.budget // 2
        while chunk := await stream.read(65_536):
            self.total += len(chunk)
            room = half - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                self.tail += chunk
                if len(self.tail) > self.budget - half:
                    del self.tail[: len(self.tail) - (self.budget - half)]

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if self.total <= self.budget:
            return head + tail
        dropped = self.total - len(self.head) - len(self.tail)
        return f"{head}\n[... {dropped:,} bytes of output cut; {self.total:,} in all ...]\n{tail}"
