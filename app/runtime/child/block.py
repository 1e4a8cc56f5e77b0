"""One block in the child: the namespace, the calls to the parent (answered from the journal
first), the sandbox helpers, and the ``done`` report; a live process keeps its namespace for
the conversation's next block (``LiveState``)."""

from __future__ import annotations

import builtins
import contextlib
import gc
import io
import mmap
import os
import signal
import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, NoReturn

from app.runtime import isolation, library, snapshot
from app.runtime.child import running
from app.runtime.child.journal import answer, local_answer, short_args
from app.runtime.child.namespace import RecordTooLarge, ToolError, namespace_names
from app.runtime.child.output import OutputStream, Results, cap_text, render_result
from app.runtime.child.parallel import NO_ITEMS, hashable, parallel_plan
from app.runtime.child.process import (
    apply_limits,
    hold_signals,
    reap_children,
    restore_signals,
    thread_count,
)
from app.runtime.child.tools import LOCAL_MEMBERS, sandbox_tool
from app.runtime.child.tracebacks import Source, render_traceback
from app.runtime.protocol import (
    BLOCK_FILENAME,
    MAX_JOURNAL_BYTES,
    MAX_PARALLEL_CALLS,
    MAX_RECORD_BYTES,
    MAX_RECORDS,
    CallRunner,
    LimitKind,
    RunRequest,
    WireEntry,
    WireLimits,
    bind_params,
    call_digest,
    decode_header,
    encode_frame,
    limit_label,
    read_frame,
    to_json,
    write_all,
    write_frame,
)

Status = Literal["ok", "error", "limit", "suspended"]


# A journaled error message of a sandbox helper is kept to this many bytes.
_ERROR_MESSAGE_BYTES: Final = 4_000


class LiveState:
    """What a live process keeps between the blocks of its conversation: the namespace, the
    directory it is confined to, the previous block's helpers (to rebind them by name), and the
    signal mask its code left, held back until the next block runs (``hold_signals``)."""

    def __init__(
        self,
        *,
        namespace: dict[str, Any],
        workdir: str,
        helpers: Mapping[str, object],
        signal_mask: bytes,
    ) -> None:
        self.namespace = namespace
        self.workdir = workdir
        self.helpers = helpers
        self.signal_mask = signal_mask

    def resume_signals(self) -> None:
        """In the next block, once its limits and wall clock hold: the signals that came between
        the blocks (the end-of-block sweep's SIGCHLD, one the code asked for) reach its handlers
        now; the last block's own limits (its wall clock's SIGALRM, SIGXCPU), if they fired as it
        ended, are dropped, or they would end this one at once."""
        restore_signals(self.signal_mask, drop=(signal.SIGALRM, signal.SIGXCPU))

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


class DryRunStopped(Exception):
    """``stop`` of the warm-up's dry block: it must neither report nor exit."""


class Block:
    """One block: the namespace, the calls to the parent, and the ``done`` report."""

    def __init__(
        self,
        *,
        request: RunRequest,
        output: OutputStream,
        channel_in: io.FileIO | None,
        channel_out: int,
        reserve: mmap.mmap | None,
        dry: bool = False,
        live: LiveState | None = None,
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
        self._dry = dry
        self._journal: Sequence[WireEntry] = request["journal"]
        self._recorded_bytes = request["journal_bytes"]  # the replay's (the server measured it)
        self._reserve = reserve
        self._stopping = False
        self._call_lock = threading.Lock()
        self.replayed = 0
        self.results = Results(int(self._limits["stdout_bytes"]))
        self.source = Source(request["code"], None)
        self.namespace: dict[str, Any] = {} if live is None else live.namespace
        self._workdir = Path(str(request["workdir"]))
        self._threads = 0  # the process's threads when the block started
        self._pid = os.getpid()  # a fork of the code is not the block: it must never report
        # The external tools' namespace functions, so ``parallel`` knows which calls to batch.
        self._external: dict[Callable[..., Any], tuple[str, Sequence[str]]] = {}
        # Its helpers by name (``run`` sets them): what an earlier block's helper, kept in a value
        # of a live process, stands for in this block (``own_helper``).
        self.members: Mapping[str, object] = {}

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
                reap_children()  # what the last block started, which the worker killed
            if self._dry or self._live is not None:
                os.chdir(workdir)  # a live process is confined to it already
            else:  # narrow the view to workdir, drop privileges, enter it (isolation.confine)
                isolation.enter(workdir, limits)
            apply_limits(limits, dry=self._dry, keep=self._keep, live=self._live is not None)
            self._workdir = Path(os.getcwd())  # canonical: symbolic links resolved
            os.environ["HOME"] = workdir
            if not self._dry and sys.path[:1] != [workdir]:
                sys.path.insert(0, workdir)
            self._threads = thread_count() if self._keep else 0
        except OSError as exc:
            self.stop("error", error=f"SandboxError: cannot enter the work directory: {exc}")
        running.current = None if self._dry else self
        running.block = self
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
            raise DryRunStopped
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
            "error": None if error is None else cap_text(error, cap),
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
        held: bytes | None = None
        try:
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
                    held = hold_signals()  # over the wait (``_ask_parent``), let go after the lock
                    answered = self._ask_parent(call, digest)
                    assert answered is not None  # only the call of a parallel batch is deferred
                    entry = answered
        finally:
            if held is not None:
                restore_signals(held)
        return answer(entry)

    def parallel(self, calls: Any, items: Any = NO_ITEMS, /, *, return_exceptions: bool = False) -> list[Any]:
        """``parallel(tool, items)`` / ``parallel([(tool, kwargs), ...])``: make every call and
        return their results in order; the external tools' calls go to the caller together, so
        one pause carries them all.

        Other callables (helpers, functions) run first, one after another, in order. Every call
        is made; then the first error (in call order) is raised, unless ``return_exceptions``
        puts each error in its place in the list. On replay the batch takes its answers from the
        journal as a group, matched by call (the caller may answer in any order).
        """
        planned = parallel_plan(calls, items)
        outcomes: list[tuple[bool, Any]] = [(True, None)] * len(planned)
        batch: list[tuple[int, str, list[Any], dict[str, Any], dict[str, Any], str]] = []
        for index, (fn, args, kwargs) in enumerate(planned):
            kept = snapshot.helper_name(fn)
            if kept is not None and fn not in self._external:
                fn = self.own_helper(kept)  # an earlier block's, kept in a value: this block's
            external = self._external.get(fn) if hashable(fn) else None
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
                    outcomes[index] = (True, answer(entry))
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
        with self._call_lock:
            if len(self._journal) > self.replayed:
                return self._replay_batch(batch)
            held = hold_signals()  # over the batch's waits (``_ask_parent``), let go after the lock
            try:
                entries = self._ask_batch(batch)
            except BaseException:
                restore_signals(held)
                raise
        restore_signals(held)
        return entries

    def _replay_batch(
        self, batch: Sequence[tuple[int, str, list[Any], dict[str, Any], dict[str, Any], str]]
    ) -> list[Sequence[Any]]:
        """The batch's answers from the journal's next entries, matched call by call."""
        size = len(batch)
        left = len(self._journal) - self.replayed
        group: list[Sequence[Any] | None] = list(self._journal[self.replayed : self.replayed + size])
        answers: list[Sequence[Any]] = []
        for _, name, args, kwargs, _, digest in batch:
            found = next(
                (j for j, e in enumerate(group) if e is not None and e[0] == name and e[1] == digest),
                None,
            )
            if found is None:
                line, code = self._call_site(depth=3)
                self._replay_diverged(
                    f"parallel(...) at line {line}: {code or ''} calls {name}({short_args(args, kwargs)}), "
                    f"which the journal did not record among the {min(left, size)} calls it holds for "
                    "this batch."
                )
            entry = group[found]
            assert entry is not None
            group[found] = None
            answers.append(entry)
        self.replayed += size
        return answers

    def _ask_batch(
        self, batch: Sequence[tuple[int, str, list[Any], dict[str, Any], dict[str, Any], str]]
    ) -> list[Sequence[Any]]:
        """The batch's calls sent to the parent, all before the block pauses."""
        line, code = self._call_site(depth=3)
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
            entries.append(self._ask_parent(call, digest, (position, len(batch))))
        if any(entry is None for entry in entries):
            raise RuntimeError("sandbox protocol: calls of a parallel batch were deferred, not paused")
        return [entry for entry in entries if entry is not None]

    def _diverged(
        self, entry: Sequence[Any], name: str, args: list[Any], kwargs: dict[str, Any], digest: str
    ) -> NoReturn:
        line, code = self._call_site(depth=4)
        self._replay_diverged(
            f"call #{self.replayed + 1} of the block is {name}({short_args(args, kwargs)}) at line "
            f"{line}: {code or ''}; the journal recorded a call to {entry[0]} (digest "
            f"{str(entry[1])[:12]}, this call {digest[:12]})."
        )

    def _replay_diverged(self, what: str) -> NoReturn:
        """End the block: on replay it made a call its journal does not hold (``what``)."""
        self.stop(
            "error",
            error=(
                f"ReplayDivergenceError: {what} A block must make the same calls, with the same "
                "arguments, when it runs again."
            ),
        )

    def _ask_parent(
        self, call: dict[str, Any], digest: str, batch: tuple[int, int] | None = None
    ) -> Sequence[Any] | None:
        """Send a call to the parent and wait for its reply (suspend stops the block); None when
        the call of a ``parallel`` batch is deferred (it waits for the caller with the batch)."""
        assert self._in is not None
        # The wall clock stops while the parent works on the call (an LLM call may be slow, a
        # parked block waits for its resume); the caller holds signals over it (``hold_signals``, let go
        # after its call lock).
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

    def own_helper(self, name: str) -> Callable[..., Any]:
        """This block's helper ``name`` (a stand-in raising NameError when it has none): what an
        earlier block's helper stands for here, as restoring the snapshot would make it."""
        found = snapshot.resolve_helper(name, self.members)
        assert callable(found)
        return found

    def _make_helper(self, *, runs: CallRunner, name: str, params: Sequence[str]) -> Callable[..., Any]:
        def helper(*args: Any, **kwargs: Any) -> Any:
            block = running.block
            if block is not None and block is not self:
                # Kept in a value (a list, an attribute) by an earlier block of this live
                # process: it acts as the running block's helper of its name, as the one a restore
                # from the snapshot would have put there (``carry_over`` rebinds variables only).
                return block.own_helper(name)(*args, **kwargs)
            return self.call(runs=runs, name=name, params=params, args=args, kwargs=kwargs)

        helper.__name__ = name.rpartition(".")[2]
        helper.__qualname__ = name
        snapshot.mark_helper(helper, name)
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
                return local_answer(entry)
            try:
                value = fn(*args, **kwargs)
            except MemoryError:
                raise
            except Exception as exc:
                message = cap_text(str(exc), _ERROR_MESSAGE_BYTES)
                self._record(name, digest, error=(type(exc).__name__, message))
                raise
            try:
                self._record(name, digest, value=to_json(value, strict=True))
            except RecordTooLarge as exc:
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
            raise RecordTooLarge(
                f"{name} returned {len(frame)} bytes of JSON, more than can be journaled "
                f"({MAX_RECORD_BYTES}); work on smaller pieces"
            )
        if self._records >= MAX_RECORDS or self._recorded_bytes + len(frame) > MAX_JOURNAL_BYTES:
            raise RecordTooLarge(
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

    def run(self, snapshot_data: bytes) -> LiveState | None:
        """Restore the namespace (or keep a live one), run the code, snapshot, report. Returns
        only when the process stays live for the next block (``_finish``); otherwise exits."""
        request = self._request
        members: dict[str, Callable[..., Any]] = {
            name: self._make_helper(runs="service", name=name, params=()) for name in request["helpers"]
        }
        for name, params in request["tools"].items():
            members[name] = self._make_helper(runs="caller", name=name, params=params)
        for name, params, file, function, source in request.get("local_tools", ()):
            members[name] = sandbox_tool(name, params=params, file=file, function=function, source=source)
        members.update(LOCAL_MEMBERS)
        visible = namespace_names(members)
        # Everything a snapshot stores by name: each helper by its full name, and the groups.
        helpers: dict[str, object] = {**members, **visible}
        self.members = helpers
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
            if request.get("prepare"):
                # Ready for the conversation's next block: the namespace is the snapshot's, as
                # the block would find it; nothing ran, so there is nothing to snapshot again.
                return self._finish("ok", error=None, helpers=helpers, dropped=dropped)
            try:
                compiled = compile(request["code"], BLOCK_FILENAME, "exec", dont_inherit=True)
            except SyntaxError as exc:
                # Nothing ran: the namespace is the one the block started from.
                return self._finish("error", error=render_traceback(exc, self.source), helpers=helpers)
            self.source = Source(request["code"], compiled)
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
    ) -> LiveState | None:
        """Report a block that ran to its end. The process stays live for the conversation's
        next block (returns its state) when the pool asked and nothing the block started runs
        on in it (a thread would run on into the next block); otherwise it exits."""
        if not self._keep or os.getpid() != self._pid or thread_count() > self._threads:
            self.stop(status, error=error, snapshot_data=snapshot_data, dropped=dropped, figures=figures)
        # Before the report: once the worker has it, it kills what the block left running, and
        # the code's handler of that SIGCHLD (or of a timer it armed) would run between the blocks,
        # outside any block's wall clock. Held, it runs in the next block, or never.
        mask = hold_signals()
        self._report(
            status,
            error=error,
            limit=None,
            snapshot_data=snapshot_data,
            dropped=dropped,
            figures=figures,
            live=True,
        )
        running.current = None
        return LiveState(
            namespace=self.namespace, workdir=self._request["workdir"], helpers=helpers, signal_mask=mask
        )

    def _execute(self, compiled: types.CodeType) -> str | None:
        """Run the code; return the rendered error, if it raised."""
        try:
            exec(compiled, self.namespace)
        except (MemoryError, DryRunStopped):
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
