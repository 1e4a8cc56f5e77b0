"""The helpers that run inside the sandbox child, next to the model's code.

``FS.read_file``/``FS.write_file``/``FS.list_files`` (confined to the block's working directory),
``Bash.execute`` (a shell command in the sandbox), ``pandas_bind`` (a DataFrame that can answer
questions about itself through the parent's ``llm_call``) and the capture of the matplotlib
figures a block leaves open.

They run in the child because that is where the files and the processes are: nothing here needs a
server secret (``.ask`` sends a description of the frame through the ``llm_call`` helper, so the
LLM key stays in the parent). The isolation backend (bubblewrap, rlimits) is the security
boundary; the confinement of ``FS`` is the helpers' own contract (the code could call ``open()``
anyway), which is also why it checks resolved paths rather than racing the code for them.

The sandbox imports this module in the worker, before any child is forked; pandas (in
``dataframes``) comes with the worker's preload, or at a block's first ``pandas_bind``. A block
reaches the block it runs in through ``Host`` (``bind``): the journal for ``FS``/``Bash`` calls,
the parent for ``llm_call``.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

from app.runtime.output import Output
from app.runtime.protocol import JOURNALED_SANDBOX_HELPERS, MAX_FIGURE_BYTES, MAX_FIGURES, SANDBOX_HELPERS

MAX_READ_BYTES: Final = 4 * 1024 * 1024
MAX_LISTED_FILES: Final = 10_000
MAX_COMMAND_OUTPUT: Final = 100_000
DEFAULT_TIMEOUT_SECONDS: Final = 60.0
# How often Bash.execute looks whether the shell has exited while a background job keeps the
# output pipe open (the common case, a command that ends, is noticed at once by EOF).
_EXIT_POLL_SECONDS: Final = 0.05


class Host(Protocol):
    """What the helpers need from the block that runs them (``child.block.Block``)."""

    @property
    def workdir(self) -> Path:
        """The block's working directory, resolved."""
        ...

    def call_helper(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call a parent-side helper (journaled; raises if the block does not have it)."""
        ...


_host: Host | None = None


def bind(host: Host | None) -> None:
    """Make ``host`` the block the helpers act for (one block per child process)."""
    global _host
    _host = host


def _current() -> Host:
    if _host is None:
        raise RuntimeError("the sandbox helpers are used outside of a block")
    return _host


# -- FS ------------------------------------------------------------------------------------


def _confined(path: object, *, what: str) -> Path:
    """``path`` resolved inside the working directory; PermissionError if it leads out of it.

    Refused: absolute paths, and relative ones that leave the directory through ``..`` or a
    symbolic link (the path is resolved, links included, before it is checked).
    """
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"{what}: the path must be a str, not {type(path).__name__}")
    if not path or "\x00" in path:
        raise ValueError(f"{what}: {path!r} is not a valid path")
    if os.path.isabs(path):
        raise PermissionError(
            f"{what}: {path!r} is an absolute path; use a path relative to the working directory"
        )
    root = _current().workdir
    try:
        target = (root / path).resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise OSError(f"{what}: cannot resolve {path!r}: {exc}") from None
    if not target.is_relative_to(root):
        raise PermissionError(f"{what}: {path!r} is outside the working directory")
    return target


def _relative(target: Path) -> str:
    return target.relative_to(_current().workdir).as_posix() or "."


def read_file(path: str) -> str:
    """The text of a file in the working directory (UTF-8; undecodable bytes replaced)."""
    target = _confined(path, what="FS.read_file")
    try:
        size = target.stat().st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"FS.read_file: no file {path!r} in the working directory") from None
    if target.is_dir():
        raise IsADirectoryError(f"FS.read_file: {path!r} is a directory; use FS.list_files")
    if size > MAX_READ_BYTES:
        raise ValueError(
            f"FS.read_file: {path!r} has {size} bytes, more than {MAX_READ_BYTES}; read it with "
            "pandas or open() in chunks instead"
        )
    return target.read_bytes().decode("utf-8", "replace")


def write_file(path: str, content: str | bytes) -> str:
    """Write ``content`` to a file of the working directory (parents created); returns its path."""
    target = _confined(path, what="FS.write_file")
    if not isinstance(content, str | bytes | bytearray):
        raise TypeError(
            f"FS.write_file: content must be str or bytes, not {type(content).__name__} "
            "(convert it first, e.g. with json.dumps or str)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        with open(target, "w", encoding="utf-8", newline="") as file:
            file.write(content)
    else:
        target.write_bytes(content)
    return _relative(target)


def list_files(directory: str = ".", pattern: str = "*") -> list[str]:
    """Files under ``directory`` matching the glob ``pattern`` (``**`` recurses), sorted, as
    paths relative to the working directory (ready for ``FS.read_file``)."""
    base = _confined(directory, what="FS.list_files")
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("FS.list_files: pattern must be a non-empty glob such as '*.csv'")
    if os.path.isabs(pattern) or ".." in Path(pattern).parts:
        raise PermissionError(f"FS.list_files: pattern {pattern!r} may not leave the directory")
    if not base.is_dir():
        raise NotADirectoryError(f"FS.list_files: {directory!r} is not a directory")
    root = _current().workdir
    found: list[str] = []
    for entry in base.glob(pattern):
        try:
            listed = entry.is_file() and entry.resolve().is_relative_to(root)
        except (OSError, RuntimeError):  # a link into a place it may not look, a link loop
            listed = False
        if not listed:
            continue  # directories, and links to files outside the working directory
        found.append(entry.relative_to(root).as_posix())
        if len(found) > MAX_LISTED_FILES:
            raise ValueError(
                f"FS.list_files: more than {MAX_LISTED_FILES} files match {pattern!r}; narrow the pattern"
            )
    return sorted(found)


# -- Bash ----------------------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """Processes started (directly or not) by ``pid``, read from /proc (best effort)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a command and what it started. Whatever escapes (a daemon that re-parented
    itself) is killed with the block's process group when the block ends."""
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def execute(command: str, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> str:
    """Run ``/bin/sh -c command`` in the working directory; its output (stdout and stderr as
    they interleave, capped), with ``[exit code N]`` appended when it fails.

    The command stays in the block's process group, so the block's limits and the end of the
    block stop it and anything it leaves running in the background.
    """
    if not isinstance(command, str):
        raise TypeError(f"Bash.execute: command must be a str, not {type(command).__name__}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"Bash.execute: timeout must be a positive number of seconds, not {timeout!r}")
    output = Output(MAX_COMMAND_OUTPUT)
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        cwd=_current().workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    try:
        timed_out = _collect(proc, proc.stdout.fileno(), output, time.monotonic() + float(timeout))
    except BaseException:
        _kill_tree(proc)
        raise
    finally:
        proc.stdout.close()
        returncode = proc.wait()
    text = output.text()
    if timed_out:
        note = f"[timed out after {float(timeout):g}s: the command was killed]"
    elif returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else -returncode
        note = f"[killed by signal {name}]"
    elif returncode:
        note = f"[exit code {returncode}]"
    else:
        return text
    return f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}{note}"


def _collect(proc: subprocess.Popen[bytes], fd: int, output: Output, deadline: float) -> bool:
    """Read the command's output until it ends; kill it at ``deadline``. True if it timed out."""
    os.set_blocking(fd, False)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            _kill_tree(proc)
            return True
        poller.poll(min(left, _EXIT_POLL_SECONDS) * 1000)
        if not _drain(fd, output) or proc.poll() is not None:
            # EOF (every writer is gone), or the shell ended while a background job it
            # started still holds the pipe: take what is there and stop reading.
            _drain(fd, output)
            break
    try:  # the shell may still run after closing its output (``exec >&-; sleep 100``)
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        return True
    return False


def _drain(fd: int, output: Output, *, max_reads: int = 16) -> bool:
    """Read what the pipe holds now, up to ``max_reads`` chunks (so a command that writes
    without end cannot keep the caller from its deadline); False at EOF."""
    for _ in range(max_reads):
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not data:
            return False
        output.add(data)
    return True


# -- pandas_bind ---------------------------------------------------------------------------


def pandas_bind(data: Any) -> Any:
    """A DataFrame (with ``.ask``) from a DataFrame, Series, list of rows/dicts, dict of columns
    (or one record), 2-D array, CSV text, or the path of a CSV/TSV file in the working directory.
    pandas is imported here, at first use (or by the worker's preload), not with this module."""
    from app.runtime import dataframes

    return dataframes.pandas_bind(data)


def __getattr__(name: str) -> Any:
    """``BoundFrame``/``describe_frame`` from before they moved to ``dataframes``: snapshots
    saved then name the class here."""
    if name in ("BoundFrame", "describe_frame"):
        from app.runtime import dataframes

        return getattr(dataframes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the registry --------------------------------------------------------------------------

# Every sandbox helper by its name in the namespace; ``protocol.SANDBOX_HELPERS`` is the same set
# for the parent, which need not import this module.
LOCAL_HELPERS: Final[Mapping[str, Callable[..., Any]]] = {
    "FS.read_file": read_file,
    "FS.write_file": write_file,
    "FS.list_files": list_files,
    "Bash.execute": execute,
    "pandas_bind": pandas_bind,
}
assert set(LOCAL_HELPERS) == SANDBOX_HELPERS
assert JOURNALED_SANDBOX_HELPERS <= SANDBOX_HELPERS


# -- figures -------------------------------------------------------------------------------


def capture_figures() -> tuple[list[bytes], list[str]]:
    """The matplotlib figures left open, as PNGs (then closed), and notes on those left out.

    Costs nothing for a block that did not use pyplot: matplotlib is never imported here.
    """
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return [], []
    try:
        numbers = pyplot.get_fignums()
    except Exception as exc:  # the code replaced or broke pyplot
        return [], [f"[figures could not be captured: {type(exc).__name__}: {exc}]"]
    if not numbers:
        return [], []
    images: list[bytes] = []
    notes: list[str] = []
    try:
        for index, number in enumerate(numbers):
            if index >= MAX_FIGURES:
                notes.append(f"[{len(numbers) - MAX_FIGURES} more figures not kept: at most {MAX_FIGURES}]")
                break
            buffer = io.BytesIO()
            try:
                pyplot.figure(number).savefig(buffer, format="png", dpi=100)
            except MemoryError:
                raise
            except Exception as exc:
                notes.append(f"[figure {number} could not be rendered: {type(exc).__name__}: {exc}]")
                continue
            if buffer.tell() > MAX_FIGURE_BYTES:
                notes.append(f"[figure {number} not kept: its PNG is larger than {MAX_FIGURE_BYTES} bytes]")
                continue
            images.append(buffer.getvalue())
    finally:
        with contextlib.suppress(Exception):
            pyplot.close("all")
    return images, notes


_warm = False


def warm() -> None:
    """Pay first-use costs once, in the worker, so no forked child pays them again: a frame
    described (pandas' lazy imports); matplotlib set to the Agg backend when it is preloaded; and
    when ``matplotlib.pyplot`` is preloaded too, a figure rendered to PNG (fonts, renderer).

    pyplot itself is imported only if the preload list names it (it adds ~16 MiB to an idle
    worker; without it, a block that plots imports it). Idempotent.
    """
    global _warm
    if _warm:
        return
    _warm = True
    # Warming is an optimisation: a library that fails here fails in the block, not the worker.
    if "pandas" in sys.modules:  # preloaded: describe a frame (pandas' own lazy imports)
        with contextlib.suppress(Exception):
            from app.runtime import dataframes

            dataframes.describe_frame(dataframes.BoundFrame({"n": [1, 2], "s": ["x", "y"]}))
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is not None:
        with contextlib.suppress(Exception):
            matplotlib.use("Agg")
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        with contextlib.suppress(Exception):
            figure = pyplot.figure(figsize=(2, 2))
            figure.add_subplot().plot([0, 1], [1, 0], label="x")
            capture_figures()
