"""The sandbox child: runs one block of untrusted Python in a fresh fork of a warm worker.

While idle, the child prepares everything that does not depend on the block (its own session,
output capture, signal handlers) and runs a dry block through the whole code path, so the real
block pays no first-use costs (copy-on-write faults, caches); then it tells the parent it is ready
and blocks on its request pipe. When a block arrives it applies the limits, restores the
namespace, runs the code, answers helper calls from the journal or over the pipe, runs the
sandbox-side helpers (``app.runtime.library``) and journals those with effects, captures the
figures left open, snapshots the namespace, reports, and exits; or, when the pool asked it to
``keep`` and the block left no thread running, stays live for its conversation's next block, which
then runs in the namespace it has (the snapshot is still sent after every block).

Pickles are only ever loaded here, never in the parent: a snapshot comes from an earlier child of
the same conversation.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import errno
import functools
import gc
import io
import json
import math
import mmap
import os
import resource
import signal
import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, NoReturn

from app.runtime import isolation, library, snapshot
from app.runtime.protocol import (
    BLOCK_FILENAME,
    EXIT_EOF,
    JOURNALED_SANDBOX_HELPERS,
    LIVE_MAX_BLOCKS,
    MAX_JOURNAL_BYTES,
    MAX_PARALLEL_CALLS,
    MAX_RECORD_BYTES,
    MAX_RECORDS,
    PREFIX,
    CallRunner,
    LimitKind,
    RunRequest,
    WireEntry,
    WireLimits,
    as_run_request,
    bind_params,
    call_digest,
    decode_header,
    encode_frame,
    limit_label,
    read_frame,
    run_request,
    to_json,
    write_all,
    write_frame,
)

Status = Literal["ok", "error", "limit", "suspended"]
_PR_SET_PDEATHSIG: Final = 1
# Address space unmapped on MemoryError so that reporting the limit does not run out too
# (RLIMIT_AS counts mappings, so an untouched mapping reserves room without using memory).
_RESERVE_BYTES: Final = 16 << 20
_WRITE_SLICE: Final = 1 << 20
# A journaled error message of a sandbox helper is kept to this many bytes.
_ERROR_MESSAGE_BYTES: Final = 4_000
# ``parallel(calls)`` was called without ``items``.
_NO_ITEMS: Final = object()
_Planned = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class ToolError(RuntimeError):
    """A helper or external tool answered with an error; ``error_type`` names its kind.

    Raised where the code called the helper, so the code can catch it (``except ToolError``).
    """

    def __init__(self, message: str, error_type: str | None = None) -> None:
        super().__init__(message)
        self.error_type = error_type


class _RecordTooLarge(ValueError):
    """A sandbox helper's value is too large to journal (the call raises this instead)."""


class HelperGroup:
    """``FS``, ``Bash``, ``Search``, ...: the helpers named ``<group>.<name>``, as attributes.

    Made anew for every block and saved in a snapshot by name only (a variable holding one is
    bound to the next block's group), so nothing of a block's machinery outlives it.
    """

    __slots__ = ("_members", "_name")
    _members: dict[str, Callable[..., Any]]
    _name: str

    def __init__(self, name: str, members: Mapping[str, Callable[..., Any]]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_members", dict(members))

    def __getattr__(self, attr: str) -> Callable[..., Any]:
        try:
            return self._members[attr]
        except KeyError:
            raise AttributeError(
                f"{self._name} has no helper {attr!r} (it has: {', '.join(sorted(self._members))})"
            ) from None

    def __setattr__(self, attr: str, value: object) -> None:
        raise AttributeError(f"the helpers of {self._name} cannot be replaced")

    def __dir__(self) -> list[str]:
        return sorted(self._members)

    def __repr__(self) -> str:
        return f"<helpers {self._name}: {', '.join(sorted(self._members))}>"


def _namespace_names(members: Mapping[str, Callable[..., Any]]) -> dict[str, Any]:
    """The namespace entries of the block's helpers: flat names as they are, dotted names
    grouped into one ``HelperGroup`` per prefix."""
    flat: dict[str, Any] = {}
    groups: dict[str, dict[str, Callable[..., Any]]] = {}
    for name, fn in members.items():
        head, dot, attr = name.partition(".")
        if dot:
            groups.setdefault(head, {})[attr] = fn
        else:
            flat[name] = fn
    return {**flat, **{head: HelperGroup(head, group) for head, group in groups.items()}}


# -- output capture ------------------------------------------------------------------------


class _OutputStream(io.TextIOBase):
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


class _Results:
    """What ``result()`` got, rendered, within a byte budget (the frame must stay bounded)."""

    def __init__(self, budget: int) -> None:
        self.items: list[str] = []
        self._left = budget
        self._lost = 0

    def add(self, text: str) -> None:
        if self._left <= 0:
            self._lost += 1
            return
        self.items.append(_cap_text(text, self._left))
        self._left -= len(text.encode("utf-8", "surrogatepass"))

    def rendered(self) -> list[str]:
        if self._lost:
            return [*self.items, f"[... {self._lost} more results truncated]"]
        return self.items


def _cap_text(text: str, limit: int) -> str:
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


# -- tracebacks ----------------------------------------------------------------------------


def _block_codes(code: types.CodeType) -> set[types.CodeType]:
    """The code object of a block and every function/class body compiled with it."""
    found = {code}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _block_codes(const)
    return found


class _Source:
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


def render_traceback(exc: BaseException, source: _Source) -> str:
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


# -- limits --------------------------------------------------------------------------------


_LIMITED: Final = (
    resource.RLIMIT_CORE,
    resource.RLIMIT_CPU,
    resource.RLIMIT_AS,
    resource.RLIMIT_NPROC,
    resource.RLIMIT_FSIZE,
    resource.RLIMIT_NOFILE,
)
# The worker's limits, read once (every child starts with the same).
_WORKER_LIMITS: Final = {which: resource.getrlimit(which) for which in _LIMITED}


def _set_limit(which: int, soft: int, hard: int | None = None) -> None:
    """Lower a resource limit, never above the hard limit the worker already had."""
    current_hard = _WORKER_LIMITS[which][1]
    hard = soft if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(which, (soft, hard))


def apply_limits(
    limits: Mapping[str, Any], *, dry: bool = False, keep: bool = False, live: bool = False
) -> None:
    """Apply the block's rlimits to this process (inherited by anything it starts).

    ``dry`` makes the same calls with the current values: the warm-up uses it. ``keep``: the
    process may stay live for later blocks of its conversation, so the hard CPU limit leaves
    room for ``LIVE_MAX_BLOCKS`` of them (the worker enforces each block's own CPU time);
    ``live``: a later block of a live process, whose hard limit was set by its first block.
    """
    wanted: list[tuple[int, int, int | None]] = [(resource.RLIMIT_CORE, 0, None)]
    # RLIMIT_CPU counts from process start: add what the fork has used already. SIGXCPU comes
    # at the soft limit, SIGKILL a second later if the code ignores it.
    used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    budget = float(limits["cpu_seconds"])
    cpu = math.ceil(used + budget)
    if live:
        cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        if cpu_hard != resource.RLIM_INFINITY and cpu >= cpu_hard:
            raise OSError(errno.EAGAIN, "this live process has no CPU time left for another block")
        wanted.append((resource.RLIMIT_CPU, cpu, cpu_hard))
    elif keep:
        wanted.append((resource.RLIMIT_CPU, cpu, cpu + math.ceil(budget + 1) * (LIVE_MAX_BLOCKS + 1) + 1))
    else:
        wanted.append((resource.RLIMIT_CPU, cpu, cpu + 1))
    # bwrap: /tmp and /dev/shm are memory too, and count against the same limit.
    memory = (int(limits["memory_mb"]) << 20) - isolation.tmpfs_bytes(limits)
    wanted.append((resource.RLIMIT_AS, memory, None))
    wanted.append((resource.RLIMIT_NPROC, int(limits["max_processes"]), None))
    wanted.append((resource.RLIMIT_FSIZE, int(limits["file_size_mb"]) << 20, None))
    wanted.append((resource.RLIMIT_NOFILE, int(limits["open_files"]), None))
    for which, soft, hard in wanted:
        if dry:
            soft, hard = _WORKER_LIMITS[which]
        _set_limit(which, soft, hard)


# Looked up once in the worker, not in every child.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (no orphans left running)."""
    parent = os.getppid()
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


# -- one block -----------------------------------------------------------------------------


def _reap_children() -> None:
    """Reap the exited children of this process (a live one: its last block's, killed)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _thread_count() -> int:
    """The threads of this process, as the kernel counts them (native ones included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


class _LiveState:
    """What a live process keeps between the blocks of its conversation: the namespace, the
    directory it is confined to, and the previous block's helpers (to rebind them by name)."""

    def __init__(self, *, namespace: dict[str, Any], workdir: str, helpers: Mapping[str, object]) -> None:
        self.namespace = namespace
        self.workdir = workdir
        self.helpers = helpers

    def carry_over(self, helpers: Mapping[str, object]) -> None:
        """Make the namespace what loading its snapshot would give the next block: a helper of
        the previous block is gone, a variable holding one holds this block's helper of that
        name (or a stand-in raising NameError), like ``snapshot.load`` does."""
        previous = {id(obj): name for name, obj in self.helpers.items()}
        namespace = self.namespace
        for key, value in list(namespace.items()):
            name = previous.get(id(value))
            if name is None:
                continue
            if key == name:
                del namespace[key]  # the binding the runtime made, made afresh by the next block
            else:
                namespace[key] = snapshot.resolve_helper(name, helpers)


class _DryRunStopped(Exception):
    """``stop`` of the warm-up's dry block: it must neither report nor exit."""


class _Block:
    """One block: the namespace, the calls to the parent, and the ``done`` report."""

    def __init__(
        self,
        *,
        request: RunRequest,
        output: _OutputStream,
        channel_in: io.FileIO | None,
        channel_out: int,
        reserve: mmap.mmap | None,
        dry: bool = False,
        live: _LiveState | None = None,
    ) -> None:
        self._request = request
        # This process may stay live for the conversation's next block (the pool asked, and
        # ``_finish`` finds it clean); ``live``: it is such a process, running a later block.
        self._keep = bool(request.get("keep")) and not dry
        self._live = live
        self._limits: WireLimits = request["limits"]
        self._output = output
        self._in = channel_in
        self._out = channel_out
        # Record frames sent, and their bytes: the worker and the parent cap them too.
        self._records = 0
        self._recorded_bytes = 0
        self._dry = dry
        self._journal: Sequence[WireEntry] = request["journal"]
        self._reserve = reserve
        self._stopping = False
        self._call_lock = threading.Lock()
        self.replayed = 0
        self.results = _Results(int(self._limits["stdout_bytes"]))
        self.source = _Source(request["code"], None)
        self.namespace: dict[str, Any] = {} if live is None else live.namespace
        self._workdir = Path(str(request["workdir"]))
        self._threads = 0  # the process's threads when the block started
        self._pid = os.getpid()  # a fork of the code is not the block: it must never report
        # The external tools' namespace functions, so ``parallel`` knows which calls to batch.
        self._external: dict[Callable[..., Any], tuple[str, Sequence[str]]] = {}

    @property
    def workdir(self) -> Path:
        """The block's working directory, resolved (``library.Host``)."""
        return self._workdir

    def start(self) -> None:
        """Apply the limits, enter the work directory, start the wall clock."""
        limits = self._limits
        try:
            workdir = self._request["workdir"]
            if self._live is not None:
                _reap_children()  # what the last block started, which the worker killed
            if self._dry or self._live is not None:
                os.chdir(workdir)  # a live process is confined to it already
            else:  # narrow the view to workdir, drop privileges, enter it (isolation.py)
                isolation.enter(workdir, limits)
            apply_limits(limits, dry=self._dry, keep=self._keep, live=self._live is not None)
            self._workdir = Path(os.getcwd())  # canonical: symbolic links resolved
            os.environ["HOME"] = workdir
            if not self._dry and sys.path[:1] != [workdir]:
                sys.path.insert(0, workdir)
            self._threads = _thread_count() if self._keep else 0
        except OSError as exc:
            self.stop("error", error=f"SandboxError: cannot enter the work directory: {exc}")
        global _current, _running
        _current = None if self._dry else self
        _running = self
        library.bind(self)
        seconds = 0.0 if self._dry else float(limits["wall_clock_seconds"])
        signal.setitimer(signal.ITIMER_REAL, seconds)

    def on_limit(self, kind: LimitKind) -> None:
        """A limit signal arrived: end the block now, keeping what it printed."""
        if not self._stopping:
            self.stop("limit", limit=limit_label(kind, self._limits))

    # The report ---------------------------------------------------------------------------

    def stop(
        self,
        status: Status,
        *,
        error: str | None = None,
        limit: str | None = None,
        snapshot_data: bytes | None = None,
        dropped: Sequence[str] = (),
        figures: Sequence[bytes] = (),
    ) -> NoReturn:
        """Send the ``done`` frame and exit at once: no more code of the block runs."""
        if os.getpid() != self._pid:
            os._exit(1)
        self._report(
            status, error=error, limit=limit, snapshot_data=snapshot_data, dropped=dropped, figures=figures
        )
        if self._dry:
            raise _DryRunStopped
        # Let the parent, woken by that write (often onto this CPU), run before this process
        # spends a millisecond tearing down its address space.
        os.sched_yield()
        os._exit(0)

    def _report(
        self,
        status: Status,
        *,
        error: str | None,
        limit: str | None,
        snapshot_data: bytes | None,
        dropped: Sequence[str],
        figures: Sequence[bytes],
        live: bool = False,
    ) -> None:
        """Write the ``done`` frame; its blob is the snapshot then the figures' PNGs
        (``figures`` gives their sizes). ``live``: this process stays for the next block."""
        self._stopping = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        for stream in (self._output, sys.__stdout__, sys.__stderr__):  # all the code wrote
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.flush()
        cap = int(self._limits["stdout_bytes"])
        # No "stdout": the worker, which holds the output pipe, adds what the block printed.
        header = {
            "t": "done",
            "status": status,
            "results": self.results.rendered(),
            "error": None if error is None else _cap_text(error, cap),
            "limit": limit,
            "dropped": list(dropped),
            "replayed": self.replayed,
            "figures": [len(image) for image in figures],
            "live": live,
        }
        if self._dry:
            decode_header(encode_frame(header)[8:])
            return
        write_frame(self._out, header, snapshot_data or b"", figures)

    def _out_of_memory(self) -> NoReturn:
        if self._reserve is not None:
            self._reserve.close()
        self.namespace.clear()
        gc.collect()
        self.stop("limit", limit=limit_label("memory", self._limits))

    # Calls to the parent ------------------------------------------------------------------

    def _call_site(self, depth: int = 3) -> tuple[int | None, str | None]:
        """Line and source of the innermost block frame that made the call."""
        # _call_site <- call <- the helper function <- its caller (maybe a library)
        frame: types.FrameType | None = sys._getframe(depth)
        while frame is not None and frame.f_code.co_filename != BLOCK_FILENAME:
            frame = frame.f_back
        if frame is None:
            return None, None
        if frame.f_code in self.source.codes:
            return frame.f_lineno, self.source.line(frame.f_lineno)
        return frame.f_lineno, None

    def call(
        self,
        *,
        runs: CallRunner,
        name: str,
        params: Sequence[str],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """A helper or tool call: from the journal if one remains, else from the parent.

        The replay path does only what the digest needs: a resume after 100 calls must cost
        little more than after one.
        """
        strict = runs == "caller"
        try:
            json_args: list[Any] = to_json(args, strict=strict)
            json_kwargs: dict[str, Any] = to_json(kwargs, strict=strict) if kwargs else {}
        except TypeError as exc:
            raise TypeError(f"{name}(): {exc}") from None
        arguments = bind_params(name, params, json_args, json_kwargs) if strict else {}
        digest = call_digest(name=name, args=json_args, kwargs=json_kwargs)
        # One call at a time, even from threads the code started: the pipe carries one
        # exchange at a time and the journal is consumed in order.
        with self._call_lock:
            if self.replayed < len(self._journal):
                entry: Sequence[Any] = self._journal[self.replayed]
                if entry[0] != name or entry[1] != digest:
                    self._diverged(entry, name, json_args, json_kwargs, digest)
                self.replayed += 1
            else:
                line, code = self._call_site()
                call = {
                    "name": name,
                    "runs": runs,
                    "args": json_args,
                    "kwargs": json_kwargs,
                    "arguments": arguments,
                    "line": line,
                    "code": code,
                }
                answered = self._ask_parent(call, digest)
                assert answered is not None  # only the call of a parallel batch is deferred
                entry = answered
        return _answer(entry)

    def parallel(
        self, calls: Any, items: Any = _NO_ITEMS, /, *, return_exceptions: bool = False
    ) -> list[Any]:
        """``parallel(tool, items)`` / ``parallel([(tool, kwargs), ...])``: make every call and
        return their results in order; the external tools' calls go to the caller together, so
        one pause carries them all.

        Other callables (helpers, functions) run first, one after another, in order. Every call
        is made; then the first error (in call order) is raised, unless ``return_exceptions``
        puts each error in its place in the list. On replay the batch takes its answers from the
        journal as a group, matched by call (the caller may answer in any order).
        """
        planned = _parallel_plan(calls, items)
        outcomes: list[tuple[bool, Any]] = [(True, None)] * len(planned)
        batch: list[tuple[int, str, list[Any], dict[str, Any], dict[str, Any], str]] = []
        for index, (fn, args, kwargs) in enumerate(planned):
            external = self._external.get(fn) if _hashable(fn) else None
            if external is None:
                try:
                    outcomes[index] = (True, fn(*args, **kwargs))
                except MemoryError:
                    raise
                except Exception as exc:
                    outcomes[index] = (False, exc)
                continue
            name, params = external
            try:
                json_args: list[Any] = to_json(list(args), strict=True)
                json_kwargs: dict[str, Any] = to_json(kwargs, strict=True) if kwargs else {}
                arguments = bind_params(name, params, json_args, json_kwargs)
            except TypeError as exc:
                outcomes[index] = (False, TypeError(f"{name}(): {exc}"))
                continue
            digest = call_digest(name=name, args=json_args, kwargs=json_kwargs)
            batch.append((index, name, json_args, json_kwargs, arguments, digest))
        if len(batch) > MAX_PARALLEL_CALLS:
            raise ValueError(
                f"parallel: {len(batch)} tool calls at once, more than {MAX_PARALLEL_CALLS}; split them"
            )
        if batch:
            for (index, *_), entry in zip(batch, self._call_batch(batch), strict=True):
                try:
                    outcomes[index] = (True, _answer(entry))
                except ToolError as exc:
                    outcomes[index] = (False, exc)
        if not return_exceptions:
            for ok, value in outcomes:
                if not ok:
                    raise value
        return [value for _, value in outcomes]

    def _call_batch(
        self, batch: Sequence[tuple[int, str, list[Any], dict[str, Any], dict[str, Any], str]]
    ) -> list[Sequence[Any]]:
        """The journal entries answering a batch of external calls: the next ``len(batch)``
        journal entries, matched call by call on name and digest (equal calls in order), else
        from the parent, all sent before the block pauses."""
        size = len(batch)
        with self._call_lock:
            left = len(self._journal) - self.replayed
            if left > 0:
                group: list[Sequence[Any] | None] = list(self._journal[self.replayed : self.replayed + size])
                answers: list[Sequence[Any]] = []
                for _, name, args, kwargs, _, digest in batch:
                    found = next(
                        (j for j, e in enumerate(group) if e is not None and e[0] == name and e[1] == digest),
                        None,
                    )
                    if found is None:
                        line, code = self._call_site(depth=2)
                        self.stop(
                            "error",
                            error=(
                                f"ReplayDivergenceError: parallel(...) at line {line}: {code or ''} calls "
                                f"{name}({_short_args(args, kwargs)}), which the journal did not record "
                                f"among the {min(left, size)} calls it holds for this batch. A block must "
                                "make the same calls, with the same arguments, when it runs again."
                            ),
                        )
                    entry = group[found]
                    assert entry is not None
                    group[found] = None
                    answers.append(entry)
                self.replayed += size
                return answers
            line, code = self._call_site(depth=2)
            entries: list[Sequence[Any] | None] = []
            for position, (_, name, args, kwargs, arguments, digest) in enumerate(batch):
                call = {
                    "name": name,
                    "runs": "caller",
                    "args": args,
                    "kwargs": kwargs,
                    "arguments": arguments,
                    "line": line,
                    "code": code,
                }
                entries.append(self._ask_parent(call, digest, (position, size)))
            if any(entry is None for entry in entries):
                raise RuntimeError("sandbox protocol: calls of a parallel batch were deferred, not paused")
            return [entry for entry in entries if entry is not None]

    def _diverged(
        self, entry: Sequence[Any], name: str, args: list[Any], kwargs: dict[str, Any], digest: str
    ) -> NoReturn:
        line, code = self._call_site(depth=4)
        self.stop(
            "error",
            error=(
                f"ReplayDivergenceError: call #{self.replayed + 1} of the block is "
                f"{name}({_short_args(args, kwargs)}) at line {line}: {code or ''}; the journal "
                f"recorded a call to {entry[0]} (digest {str(entry[1])[:12]}, this "
                f"call {digest[:12]}). A block must make the same calls, with the same "
                "arguments, when it runs again."
            ),
        )

    def _ask_parent(
        self, call: dict[str, Any], digest: str, batch: tuple[int, int] | None = None
    ) -> Sequence[Any] | None:
        """Send a call to the parent and wait for its reply (suspend stops the block); None when
        the call of a ``parallel`` batch is deferred (it waits for the caller with the batch)."""
        assert self._in is not None
        # The wall clock stops while the parent works on the call (an LLM call may be slow).
        remaining, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        with contextlib.suppress(OSError):
            self._output.flush()  # what was printed before the call comes before its effects
        frame: dict[str, Any] = {"t": "call", "digest": digest, "call": call}
        if batch is not None:
            frame["batch"] = list(batch)
        try:
            write_frame(self._out, frame)
            reply, _ = read_frame(self._in)
        finally:
            if remaining > 0 and not self._stopping:
                signal.setitimer(signal.ITIMER_REAL, remaining)
        if reply.get("t") != "reply":
            raise RuntimeError(f"sandbox protocol: expected a reply, got {reply.get('t')!r}")
        if reply["kind"] == "suspend":
            self.stop("suspended")
        if reply["kind"] == "deferred":
            if batch is None or batch[0] == batch[1] - 1:
                raise RuntimeError("sandbox protocol: a deferred reply outside of a parallel batch")
            return None
        if reply["kind"] == "error":
            return [call["name"], digest, None, reply["error_type"], reply["error_message"]]
        return [call["name"], digest, reply["value"]]

    def _make_helper(self, *, runs: CallRunner, name: str, params: Sequence[str]) -> Callable[..., Any]:
        def helper(*args: Any, **kwargs: Any) -> Any:
            return self.call(runs=runs, name=name, params=params, args=args, kwargs=kwargs)

        helper.__name__ = name.rpartition(".")[2]
        helper.__qualname__ = name
        if runs == "caller":
            helper.__doc__ = f"{name}({', '.join(params)}): a tool run by the caller."
            self._external[helper] = (name, params)
        else:
            helper.__doc__ = f"{name}(...): a helper run by the service."
        return helper

    def call_helper(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call the parent-side helper ``name`` for a sandbox helper (``library.Host``): e.g.
        ``llm_call`` for ``BoundFrame.ask``. Journaled like a call the code made itself."""
        if name not in self._request["helpers"]:
            raise NameError(f"the {name} helper is not available in this block")
        return self.call(runs="service", name=name, params=(), args=args, kwargs=kwargs)

    # Sandbox-side helpers (journaled) ----------------------------------------------------

    def call_local(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """A sandbox helper with effects: from the journal if one remains, else run here and
        recorded (a ``record`` frame, in call order with the calls to the parent).

        So when a paused block runs again, a command it ran or a file it wrote before the pause
        is not run or written twice; a changed call is a divergence, as for any other call. An
        exception is journaled too (by type name and message) and raised again on replay.
        """
        json_args: list[Any] = to_json(args, strict=False)
        json_kwargs: dict[str, Any] = to_json(kwargs, strict=False) if kwargs else {}
        digest = call_digest(name=name, args=json_args, kwargs=json_kwargs)
        # The lock also orders the journal when threads of the code call helpers at once.
        with self._call_lock:
            if self.replayed < len(self._journal):
                entry = self._journal[self.replayed]
                if entry[0] != name or entry[1] != digest:
                    self._diverged(entry, name, json_args, json_kwargs, digest)
                self.replayed += 1
                return _local_answer(entry)
            try:
                value = fn(*args, **kwargs)
            except MemoryError:
                raise
            except Exception as exc:
                message = _cap_text(str(exc), _ERROR_MESSAGE_BYTES)
                self._record(name, digest, error=(type(exc).__name__, message))
                raise
            try:
                self._record(name, digest, value=to_json(value, strict=True))
            except _RecordTooLarge as exc:
                self._record(name, digest, error=("ValueError", str(exc)))
                raise ValueError(str(exc)) from None
            return value

    def _record(
        self, name: str, digest: str, *, value: Any = None, error: tuple[str, str] | None = None
    ) -> None:
        """Tell the parent that a sandbox helper ran (one-way ``record`` frame)."""
        frame = encode_frame(
            {
                "t": "record",
                "name": name,
                "digest": digest,
                "value": value,
                "error_type": None if error is None else error[0],
                "error_message": None if error is None else error[1],
            }
        )
        if len(frame) > MAX_RECORD_BYTES:
            raise _RecordTooLarge(
                f"{name} returned {len(frame)} bytes of JSON, more than can be journaled "
                f"({MAX_RECORD_BYTES}); work on smaller pieces"
            )
        if self._records >= MAX_RECORDS or self._recorded_bytes + len(frame) > MAX_JOURNAL_BYTES:
            raise _RecordTooLarge(
                f"this block's journal is full ({MAX_RECORDS} records or {MAX_JOURNAL_BYTES} bytes); "
                "do the rest in another block"
            )
        self._records += 1
        self._recorded_bytes += len(frame)
        if not self._dry:
            write_all(self._out, frame)

    def result(self, value: object) -> None:
        """Add ``value`` to the block's results."""
        self.results.add(render_result(value))

    # Running ------------------------------------------------------------------------------

    def run(self, snapshot_data: bytes) -> _LiveState | None:
        """Restore the namespace (or keep a live one), run the code, snapshot, report. Returns
        only when the process stays live for the next block (``_finish``); otherwise exits."""
        request = self._request
        members: dict[str, Callable[..., Any]] = {
            name: self._make_helper(runs="service", name=name, params=()) for name in request["helpers"]
        }
        for name, params in request["tools"].items():
            members[name] = self._make_helper(runs="caller", name=name, params=params)
        for name, params, file, function, source in request.get("local_tools", ()):
            members[name] = _sandbox_tool(name, params=params, file=file, function=function, source=source)
        members.update(_LOCAL_MEMBERS)
        visible = _namespace_names(members)
        # Everything a snapshot stores by name: each helper by its full name, and the groups.
        helpers: dict[str, object] = {**members, **visible}
        fixed: dict[str, Any] = {
            **visible,
            "result": self.result,
            "parallel": self.parallel,
            "ToolError": ToolError,
        }
        ns = self.namespace
        try:
            dropped: list[str] = []
            if self._live is not None:
                self._live.carry_over(helpers)
            elif snapshot_data:
                dropped = snapshot.load(snapshot_data, namespace=ns, helpers=helpers)
            ns.update(fixed)
            ns["__builtins__"] = builtins
            ns["__name__"] = "__main__"
            try:
                compiled = compile(request["code"], BLOCK_FILENAME, "exec", dont_inherit=True)
            except SyntaxError as exc:
                # Nothing ran: the namespace is the one the block started from.
                return self._finish("error", error=render_traceback(exc, self.source), helpers=helpers)
            self.source = _Source(request["code"], compiled)
            error = self._execute(compiled)
            if self.replayed < len(self._journal):
                self.stop(
                    "error",
                    error=(
                        f"ReplayDivergenceError: the block made {self.replayed} calls, but the "
                        f"journal recorded {len(self._journal)}; the next recorded call was to "
                        f"{self._journal[self.replayed][0]}. A block must make the same "
                        "calls when it runs again." + (f"\n{error}" if error else "")
                    ),
                )
            figures, notes = library.capture_figures()
            for note in notes:
                self._output.write(f"{note}\n")
            data, lost = snapshot.dump(
                ns,
                skip=frozenset(fixed),
                helpers=helpers,
                max_bytes=int(self._limits["snapshot_bytes"]),
            )
        except MemoryError as exc:
            # Drop the frames (and their locals) the traceback keeps alive before reporting.
            exc.__traceback__ = None
            self._out_of_memory()
        except snapshot.SnapshotTooLarge:
            self.stop("limit", limit=limit_label("snapshot_size", self._limits))
        except snapshot.SnapshotFormatError as exc:
            self.stop("error", error=f"SnapshotError: {exc}")
        for name in lost:  # a live process keeps what a replay from the snapshot would have
            ns.pop(name, None)
        return self._finish(
            "error" if error else "ok",
            error=error,
            helpers=helpers,
            snapshot_data=data,
            dropped=list(dict.fromkeys([*dropped, *lost])),
            figures=figures,
        )

    def _finish(
        self,
        status: Literal["ok", "error"],
        *,
        error: str | None,
        helpers: Mapping[str, object],
        snapshot_data: bytes | None = None,
        dropped: Sequence[str] = (),
        figures: Sequence[bytes] = (),
    ) -> _LiveState | None:
        """Report a block that ran to its end. The process stays live for the conversation's
        next block (returns its state) when the pool asked and nothing the block started runs
        on in it (a thread would run on into the next block); otherwise it exits."""
        if not self._keep or os.getpid() != self._pid or _thread_count() > self._threads:
            self.stop(status, error=error, snapshot_data=snapshot_data, dropped=dropped, figures=figures)
        self._report(
            status,
            error=error,
            limit=None,
            snapshot_data=snapshot_data,
            dropped=dropped,
            figures=figures,
            live=True,
        )
        global _current
        _current = None
        return _LiveState(namespace=self.namespace, workdir=self._request["workdir"], helpers=helpers)

    def _execute(self, compiled: types.CodeType) -> str | None:
        """Run the code; return the rendered error, if it raised."""
        try:
            exec(compiled, self.namespace)
        except (MemoryError, _DryRunStopped):
            raise
        except SystemExit as exc:
            # exit() / sys.exit() end the block early; only a failure code is an error.
            if exc.code not in (None, 0):
                return render_traceback(exc, self.source)
        except BaseException as exc:
            if os.getpid() != self._pid:
                os._exit(1)  # a fork the code made and did not end
            if isinstance(exc, BlockingIOError) and isolation.fork_refused():
                self.stop("limit", limit=limit_label("processes", self._limits))
            return render_traceback(exc, self.source)
        if os.getpid() != self._pid:
            os._exit(0)
        return None


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _parallel_plan(calls: Any, items: Any) -> list[_Planned]:
    """The calls ``parallel`` was given, as (function, args, kwargs): ``parallel(tool, items)``
    (an item that is a dict gives keyword arguments, any other item the one positional
    argument) or ``parallel(calls)``, each call a ``(function, kwargs)`` or ``(function,)`` pair."""
    planned: list[_Planned] = []
    if items is not _NO_ITEMS:
        if not callable(calls):
            raise TypeError(f"parallel(tool, items): tool must be a function, not {type(calls).__name__}")
        if isinstance(items, str | bytes | Mapping) or not hasattr(items, "__iter__"):
            raise TypeError(
                "parallel(tool, items): items must be a list (of dicts of keyword arguments, or of "
                f"single arguments), not {type(items).__name__}"
            )
        for item in items:
            if isinstance(item, Mapping):
                planned.append((calls, (), _keywords(item)))
            else:
                planned.append((calls, (item,), {}))
    else:
        if callable(calls) or isinstance(calls, str | bytes | Mapping) or not hasattr(calls, "__iter__"):
            raise TypeError(
                "parallel needs parallel(tool, items) or parallel([(tool, {kwargs}), ...]), not "
                f"one {type(calls).__name__}"
            )
        for position, call in enumerate(calls):
            if not isinstance(call, tuple | list) or not 1 <= len(call) <= 2 or not callable(call[0]):
                raise TypeError(
                    f"parallel: call #{position + 1} must be a (tool, {{keyword arguments}}) pair, "
                    f"not {call!r:.80}"
                )
            keywords = call[1] if len(call) == 2 else {}
            if not isinstance(keywords, Mapping):
                raise TypeError(
                    f"parallel: the arguments of call #{position + 1} must be a dict of keyword "
                    f"arguments, not {type(keywords).__name__}"
                )
            planned.append((call[0], (), _keywords(keywords)))
    if len(planned) > 10 * MAX_PARALLEL_CALLS:
        raise ValueError(f"parallel: {len(planned)} calls at once; split them")
    return planned


def _keywords(mapping: Mapping[Any, Any]) -> dict[str, Any]:
    keys = [key for key in mapping if not isinstance(key, str)]
    if keys:
        raise TypeError(f"parallel: keyword argument names must be strings, not {keys[0]!r:.40}")
    return dict(mapping)


def _short_args(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """Short ``1, "x", key=2`` text of a call's JSON arguments, for error messages."""
    parts = [json.dumps(a)[:80] for a in args]
    parts += [f"{k}={json.dumps(v)[:80]}" for k, v in kwargs.items()]
    return ", ".join(parts)


def _answer(entry: Sequence[Any]) -> Any:
    """The value of a journal entry (wire form), or its error raised as ToolError."""
    if len(entry) > 3:
        raise ToolError(str(entry[4] or ""), entry[3])
    return entry[2]


def _local_answer(entry: Sequence[Any]) -> Any:
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


def _journaled(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The namespace function of a journaled sandbox helper (``FS.write_file``, ...): runs it
    through the running block's journal. Made once, in the worker, so a block does not pay for
    it; saved in a snapshot by name, like every helper."""

    def helper(*args: Any, **kwargs: Any) -> Any:
        if _running is None:
            raise RuntimeError(f"{name} is used outside of a block")
        return _running.call_local(name, fn, args, kwargs)

    functools.update_wrapper(helper, fn)
    helper.__qualname__ = name
    return helper


# Persona tool modules compiled in this child, by (file, source): at most once per block.
_tool_modules: dict[tuple[str, str], types.ModuleType] = {}


def _tool_function(*, file: str, function: str, source: str) -> Callable[..., Any]:
    """The persona tool's function, from its source compiled here (the sandbox cannot see the
    persona's files). The module is registered so that objects it defines survive a snapshot:
    cloudpickle stores them by value."""
    key = (file, source)
    module = _tool_modules.get(key)
    if module is None:
        stem = "".join(c if c.isalnum() else "_" for c in Path(file).stem)
        module = types.ModuleType(f"sabre_persona_tools.{stem}_{len(_tool_modules)}")
        module.__file__ = file
        sys.modules[module.__name__] = module
        try:
            exec(compile(source, file, "exec", dont_inherit=True), module.__dict__)
        except BaseException:
            del sys.modules[module.__name__]
            raise
        snapshot.pickle_by_value(module)
        _tool_modules[key] = module
    fn = getattr(module, function, None)
    if not callable(fn):
        raise NameError(f"{Path(file).name} does not define a function {function!r}")
    return fn  # type: ignore[no-any-return]


def _sandbox_tool(
    name: str, *, params: Sequence[str], file: str, function: str, source: str
) -> Callable[..., Any]:
    """The namespace function of a persona's Python tool: arguments bound to the schema's
    parameter names, run here, journaled (so a paused block replays it rather than running it
    twice); its result must be JSON, as a journal value and as any tool's result is."""

    def run(**arguments: Any) -> Any:
        value = _tool_function(file=file, function=function, source=source)(**arguments)
        if hasattr(value, "__await__"):  # an async def tool
            import asyncio  # only here: the warm worker does not pay for asyncio

            value = asyncio.run(_awaited(value))
        try:
            return to_json(value, strict=True)
        except TypeError as exc:
            raise TypeError(
                f"{name}() returned {type(value).__name__}, which is not JSON ({exc}); a persona "
                "tool returns dicts, lists, strings, numbers, booleans or None"
            ) from None

    def tool(*args: Any, **kwargs: Any) -> Any:
        if _running is None:
            raise RuntimeError(f"{name} is used outside of a block")
        return _running.call_local(name, run, (), bind_params(name, params, args, kwargs))

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = f"{name}({', '.join(params)}): a tool of this persona."
    return tool


async def _awaited(value: Any) -> Any:
    return await value


# The sandbox helpers as the namespace gets them (before grouping ``FS.*``/``Bash.*``).
_LOCAL_MEMBERS: Final[Mapping[str, Callable[..., Any]]] = {
    name: _journaled(name, fn) if name in JOURNALED_SANDBOX_HELPERS else fn
    for name, fn in library.LOCAL_HELPERS.items()
}


# -- the child's life ----------------------------------------------------------------------

_current: _Block | None = None  # the block limit signals stop (None during the warm-up)
_running: _Block | None = None  # the block the sandbox helpers act for (the warm-up's too)


def _on_limit_signal(signum: int, frame: types.FrameType | None) -> None:
    """SIGXCPU (RLIMIT_CPU) or SIGALRM (the wall clock): the running block ends itself.

    So its output is kept and the worker survives; the parent kills the child only when this
    cannot run (code stuck in C, handlers replaced by the code).
    """
    if _current is not None:
        _current.on_limit("cpu_time" if signum == signal.SIGXCPU else "wall_clock")


_WARM_UP_CODE: Final = """\
def f(x):
    return x + 1
y = f(a)
z = tool(y, mode="x")
files = FS.list_files()
print(y, z, files)
result({"y": y, "z": z})
1 / 0
"""


def _warm_up_values() -> dict[str, Any]:
    """Values for the dry block's snapshot: a function (cloudpickle's by-value path) and plain
    data. Not numpy or pandas objects: pickling them faults in pages every child would then pay
    for (~4 ms of CPU per block, a fifth of a trivial block's whole cost), while only the blocks
    that keep such values need them, and those pay it themselves."""
    return {"a": 1, "g": lambda: 1, "s": {"k": [1.5, "x", None]}}


def warm_up() -> None:
    """Run a dry block through the real code path (journal-answered call, snapshot load and
    dump, traceback, report encoding) once in the worker, before it forks, so no block pays the
    first-use costs (lazy imports and caches). Not again in each child: that would also pay its
    copy-on-write faults ahead of the block (~0.3 ms of start latency saved) at ~1.3 ms of CPU
    per block, which a loaded server needs more (bench/runtime_bench.py measures both)."""
    output = _OutputStream(None)
    saved = sys.stdout, sys.stderr, os.environ.get("HOME"), os.getcwd()
    sys.stdout = sys.stderr = output
    library.warm()
    digest = call_digest(name="tool", args=[2], kwargs={"mode": "x"})
    listed = call_digest(name="FS.list_files", args=[], kwargs={})
    limits = WireLimits(
        cpu_seconds=10,
        memory_mb=2048,
        wall_clock_seconds=30,
        max_processes=64,
        file_size_mb=100,
        open_files=256,
        stdout_bytes=32_000,
        snapshot_bytes=1 << 20,
        disk_mb=1024,
        disk_files=10_000,
    )
    request = run_request(
        code=_WARM_UP_CODE,
        workdir=os.getcwd(),
        limits=limits,
        helpers=["helper"],
        tools={"tool": ["x", "mode"]},
        journal=[["tool", digest, 3], ["FS.list_files", listed, ["a.txt"]]],
    )
    # Through the wire format, as a real request comes (its decoding warms up too).
    request = as_run_request(decode_header(encode_frame(request)[PREFIX.size :]))
    data, _ = snapshot.dump(_warm_up_values(), skip=frozenset(), helpers={}, max_bytes=1 << 20)
    block = _Block(request=request, output=output, channel_in=None, channel_out=-1, reserve=None, dry=True)
    try:
        block.start()
        block.run(data)
    except _DryRunStopped:
        pass
    global _running
    _running = None
    library.bind(None)
    sys.stdout, sys.stderr, home, cwd = saved
    if home is None:
        os.environ.pop("HOME", None)
    os.chdir(cwd)
    gc.collect()


def serve_one(*, channel: int, log_fd: int) -> int:
    """Life of one forked child: prepare, say ready, run one block, report. Returns exit code.

    The worker arranged the descriptors before this runs (``app.runtime.worker``): 0 is
    /dev/null, 1 and 2 the output pipe only the worker reads, ``channel`` this child's own
    socket to the worker (nothing of the worker's pipes to the server survives the fork), and
    ``log_fd`` the worker's log, for runtime bugs until the request arrives and closed before
    the block's code runs. Nothing the block sends reaches the server unchecked: the worker
    reads the channel, validates and caps every frame, and speaks for the child's life itself.
    """
    os.setsid()  # its own process group: killing the group kills what the code started
    die_with_parent()
    # Python ignores SIGXFSZ (writes past RLIMIT_FSIZE then fail with EFBIG); the default
    # action ends the block and the parent reports it as file_size.
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    signal.signal(signal.SIGXCPU, _on_limit_signal)
    signal.signal(signal.SIGALRM, _on_limit_signal)
    output = _OutputStream(1)
    sys.stdout = sys.stderr = output
    reserve = mmap.mmap(-1, _RESERVE_BYTES)
    stream = io.FileIO(channel, "rb", closefd=False)
    write_frame(channel, {"t": "ready"})
    try:
        header, snapshot_data = read_frame(stream)
    except EOFError:
        return EXIT_EOF
    request = as_run_request(header)
    os.close(log_fd)
    live: _LiveState | None = None
    for _ in range(LIVE_MAX_BLOCKS):
        block = _Block(
            request=request, output=output, channel_in=stream, channel_out=channel, reserve=reserve, live=live
        )
        block.start()
        live = block.run(snapshot_data)
        if live is None:
            return 0
        # Live: this process belongs to the conversation; only its next block, or the word to
        # stop, may come (the worker checks both before passing them on).
        try:
            header, snapshot_data = read_frame(stream)
        except EOFError:
            return 0
        if header.get("t") == "release":
            return 0
        request = as_run_request(header)
        if not request.get("live") or request["workdir"] != live.workdir or snapshot_data:
            raise RuntimeError("sandbox protocol: a live process got a request that is not its next block")
    return 0
