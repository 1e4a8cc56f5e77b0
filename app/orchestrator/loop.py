"""The turn loop: model → ``<helpers>`` block → sandbox → ``<helpers_result>`` → model, until an answer.

This is the hot path of the service and reads top to bottom: ``TurnLoop.run`` is one turn. It knows
nothing of HTTP or the store: it gets the transcript and snapshot in, and gives new messages, the new
snapshot and the outcome back (the conversations service persists them).
"""

from __future__ import annotations

import asyncio
import base64
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar

import structlog

from app.events.recorder import TurnRecorder
from app.helpers import HELPERS, SERVICE_HELPERS, HelperContext, HelperError, Usage
from app.helpers import threads as helper_threads
from app.helpers.net import FetchLimits
from app.helpers.threads import HelperThreads
from app.kit import tracing
from app.kit.clock import utcnow
from app.kit.ids import new_id
from app.kit.metrics import BLOCK_FAILURES, BLOCK_PROCESSES, BLOCK_SECONDS, BLOCKS
from app.llm.base import DeltaCallback, LLMClient, LLMError, LLMErrorCode
from app.orchestrator.messages import (
    HelpersPart,
    HelpersResultPart,
    TextPart,
    ToolCallPart,
    TranscriptMessage,
)
from app.orchestrator.parser import OPEN, blocks, parse, prose
from app.orchestrator.paused import PausedBlock, PendingCall, ResumeBlock
from app.orchestrator.render import StoredMessage, render_helpers_result, to_llm_messages
from app.personas.models import Network
from app.runtime import BlockOutcome, CallReply, HelperCall, Limits, RuntimePool, SandboxTool
from app.tools.registry import Tool, ToolRegistry

log = structlog.get_logger(__name__)
T = TypeVar("T")

TurnStatus = Literal["completed", "awaiting_tool_results", "failed", "cancelled"]


# Why a turn failed, as ``TurnErrorBody.code`` tells API clients: the model server's (``LLMErrorCode``),
# or the turn's own: the model did not finish in max_iterations; its outcome could not be stored; another
# turn took the conversation first; the server running it stopped; an unexpected failure (logged).
TurnErrorCode = (
    LLMErrorCode
    | Literal["max_iterations_reached", "turn_not_stored", "turn_superseded", "runner_lost", "internal_error"]
)


@dataclass(frozen=True, slots=True)
class TurnError:
    """Why a turn failed: a stable code, a readable message, and whether retrying can help."""

    code: TurnErrorCode
    message: str
    retryable: bool = False


@dataclass(slots=True)
class TurnInput:
    """What one turn needs: the conversation as stored, and the new user message."""

    conversation_id: str
    turn_id: str
    tenant: str  # whose share of the sandbox workers its blocks take
    system_prompt: str
    model: str
    history: Sequence[StoredMessage]
    new_messages: list[TranscriptMessage]
    snapshot: bytes | None
    max_iterations: int
    workdir: Path
    limits: Limits
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    resume: ResumeBlock | None = None
    network: Network | None = None
    tool_call_ttl: timedelta = timedelta(hours=24)
    # Where the turn's events go (None: not recorded), and the signal that cancels it.
    events: TurnRecorder | None = None
    cancel: asyncio.Event | None = None


@dataclass(slots=True)
class TurnOutcome:
    """What one turn produced; the caller persists all of it in one transaction."""

    status: TurnStatus
    output: str | None
    error: TurnError | None
    usage: Usage
    messages: list[TranscriptMessage]
    snapshot: bytes | None
    paused: PausedBlock | None = None
    warnings: list[str] = field(default_factory=list)


class TurnLoop:
    """Runs turns with one LLM client and one sandbox pool (both owned by the app's lifespan)."""

    def __init__(
        self,
        *,
        llm: LLMClient,
        pool: RuntimePool,
        max_output_chars: int,
        images: bool = False,
        fetch_limits: FetchLimits | None = None,
        helper_threads: HelperThreads | None = None,
    ) -> None:
        self._llm = llm
        # Where helpers' blocking work runs, as the turn's tenant's (app.helpers.threads).
        self._threads = helper_threads or HelperThreads()
        self._fetch_limits = fetch_limits
        self._pool = pool
        self._max_output_chars = max_output_chars
        self._images = images  # whether the model takes images: figures are shown to it

    async def run(self, turn: TurnInput, *, depth: int = 0, parent_event: str | None = None) -> TurnOutcome:
        """Run one turn until the model answers, the turn pauses on a tool call, it fails or it is
        cancelled. ``parent_event``: the node its events nest under (a sub-task's ``helper.started``)."""
        iterations = tracing.SpanSequence("iteration")  # a span per iteration, when tracing is on
        try:
            with helper_threads.using(self._threads, turn.tenant):
                return await self._run(turn, iterations, depth=depth, parent_event=parent_event)
        finally:
            iterations.close()

    async def _run(
        self, turn: TurnInput, iterations: tracing.SpanSequence, *, depth: int, parent_event: str | None
    ) -> TurnOutcome:
        events = turn.events
        node = parent_event  # None: the turn's own root (turn.started)
        ctx = HelperContext(
            llm=self._llm,
            model=turn.model,
            workdir=turn.workdir,
            network=turn.network,
            depth=depth,
            fetch_limits=self._fetch_limits,
        )
        block_event: str | None = None
        ctx.subtask = lambda description, data: self._subtask(
            turn, ctx, description=description, data=data, parent_event=ctx.current_event
        )
        messages = list(turn.new_messages)
        snapshot = turn.snapshot
        last_prose: str | None = None
        block = turn.resume  # a resumed turn first finishes the block it paused in
        # Rendered once; only this turn's messages change.
        history = to_llm_messages(turn.history, max_result_chars=self._max_output_chars)

        while True:
            if block is None:
                if ctx.usage.iterations >= turn.max_iterations:
                    error = TurnError(
                        code="max_iterations_reached",
                        message=f"The model did not finish within max_iterations={turn.max_iterations}.",
                    )
                    return _finish("failed", last_prose, ctx, messages, snapshot, error=error)
                ctx.usage.iterations += 1
                iterations.next({"sabre.iteration": ctx.usage.iterations})
                llm_event = (
                    events.emit(
                        "llm.started", {"iteration": ctx.usage.iterations, "model": turn.model}, parent=node
                    )
                    if events is not None
                    else None
                )
                on_delta = _watch_for_block(
                    _delta_sink(events, llm_event),
                    functools.partial(self._prepare_block, turn, snapshot),
                )
                try:
                    response = await _unless_cancelled(
                        tracing.traced(
                            "llm.call",
                            {"sabre.model": turn.model},
                            self._llm.complete(
                                model=turn.model,
                                instructions=turn.system_prompt,
                                messages=to_llm_messages(
                                    [(m.role, m.dump_parts()) for m in messages],
                                    after=history,
                                    images=_images(messages) if self._images else None,
                                    max_result_chars=self._max_output_chars,
                                ),
                                on_delta=on_delta,
                            ),
                        ),
                        turn.cancel,
                    )
                except TurnCancelled:
                    return _finish("cancelled", last_prose, ctx, messages, snapshot)
                except LLMError as exc:
                    log.warning("llm_failed", turn_id=turn.turn_id, code=exc.code)
                    error = TurnError(code=exc.code, message=exc.message, retryable=exc.retryable)
                    return _finish("failed", last_prose, ctx, messages, snapshot, error=error)
                ctx.usage.add_llm(response.usage)
                if events is not None and llm_event is not None:
                    events.emit(
                        "llm.completed",
                        {
                            "input_tokens": response.usage.input_tokens,
                            "output_tokens": response.usage.output_tokens,
                        },
                        parent=llm_event,
                    )
                segments = parse(response.text)
                code_blocks = blocks(segments)
                last_prose = prose(segments)
                messages.append(_assistant_message(segments))
                if not code_blocks:
                    return _finish("completed", last_prose, ctx, messages, snapshot)
                note = (
                    "Only the first <helpers> block of your message was run: write one block at a time."
                    if len(code_blocks) > 1
                    else None
                )
                block = ResumeBlock(code=code_blocks[0].content, note=note)

            block_event = (
                events.emit(
                    "block.started", {"code": block.code, "resumed": bool(block.journal)}, parent=node
                )
                if events is not None
                else None
            )
            try:
                outcome = await _unless_cancelled(
                    tracing.traced(
                        "block",
                        {"sabre.resumed": bool(block.journal)},
                        self._pool.run_block(
                            code=block.code,
                            snapshot=snapshot,
                            workdir=turn.workdir,
                            limits=turn.limits,
                            tenant=turn.tenant,
                            **_block_names(turn.tools),
                            journal=block.journal,
                            on_call=functools.partial(
                                self._on_call, ctx, turn.tools, events=events, parent=block_event
                            ),
                        ),
                    ),
                    turn.cancel,
                )
            except TurnCancelled:
                # The block's process is gone; its namespace stays as it was before the block.
                text = "The block was cancelled before it finished: nothing it did is kept."
                messages.append(
                    TranscriptMessage(role="user", parts=[HelpersResultPart(status="error", text=text)])
                )
                if events is not None:
                    events.emit("block.completed", {"status": "cancelled", "text": text}, parent=block_event)
                return _finish("cancelled", last_prose, ctx, messages, snapshot)
            BLOCKS.labels(outcome=outcome.status).inc()
            BLOCK_PROCESSES.labels(process=outcome.process).inc()
            if outcome.failure is not None:
                BLOCK_FAILURES.labels(failure=outcome.failure).inc()
                log.warning("block_failed", turn_id=turn.turn_id, failure=outcome.failure)
            BLOCK_SECONDS.observe(outcome.duration_ms / 1000)
            if outcome.status == "suspended" and outcome.pending is not None:
                # One pause carries every call the block waits on (a ``parallel(...)`` batch).
                expires_at = utcnow() + turn.tool_call_ttl
                pending = [
                    PendingCall(id=new_id("call"), call=call, expires_at=expires_at)
                    for call in outcome.all_pending
                ]
                messages.append(
                    TranscriptMessage(
                        role="assistant",
                        parts=[
                            ToolCallPart(
                                id=p.id, name=p.call.name, arguments=p.call.arguments, code=p.call.code
                            )
                            for p in pending
                        ],
                    )
                )
                if events is not None:
                    events.emit(
                        "tool_calls.pending",
                        {
                            "tool_calls": [
                                {"id": p.id, "name": p.call.name, "arguments": p.call.arguments}
                                for p in pending
                            ]
                        },
                        parent=block_event,
                    )
                paused = PausedBlock(
                    code=block.code, journal=outcome.journal, pending=pending, note=block.note
                )
                # The snapshot stays the one from before the block: the resume replays it from there.
                result = _finish("awaiting_tool_results", None, ctx, messages, snapshot)
                result.paused = paused
                return result
            if outcome.snapshot is not None:
                snapshot = outcome.snapshot
            result_message = self._result_message(outcome, note=block.note)
            messages.append(result_message)
            if events is not None:
                part = result_message.parts[0]
                assert isinstance(part, HelpersResultPart)
                events.emit(
                    "block.completed",
                    {"status": outcome.status, "text": part.text, "files": part.files},
                    parent=block_event,
                )
            block = None

    async def _subtask(
        self,
        parent: TurnInput,
        ctx: HelperContext,
        *,
        description: str,
        data: list[Any],
        parent_event: str | None = None,
    ) -> str:
        """``sabre_call``: the task in a fresh child conversation (no history, empty namespace, no
        external tools: a sub-task cannot pause for the caller), sharing the working directory."""
        body = description if not data else description + "\n\nData:\n" + "\n".join(map(str, data))
        child = TurnInput(
            conversation_id=parent.conversation_id,
            turn_id=f"{parent.turn_id}/sub",
            tenant=parent.tenant,
            system_prompt=parent.system_prompt,
            model=parent.model,
            history=(),
            new_messages=[TranscriptMessage(role="user", parts=[TextPart(text=body)])],
            snapshot=None,
            max_iterations=parent.max_iterations,
            workdir=parent.workdir,
            limits=parent.limits,
            network=parent.network,
            events=parent.events,
            cancel=parent.cancel,
        )
        # The parent block holds a sandbox worker while it waits: with none free, the sub-task could
        # wait for ever (and the parent's wall clock is paused during helper calls), so refuse it.
        # Of each kind: the sub-task's blocks may need the preloads or not, and a plain worker's
        # block waits for a plain worker (the parent may hold the only one).
        if not self._pool.every_kind_idle:
            raise HelperError(
                "sabre_call: no sandbox worker is free for the sub-task "
                "(raise SABRE_RUNTIME_WORKERS, or SABRE_RUNTIME_PLAIN_WORKERS)"
            )
        budget = parent.limits.wall_clock_seconds * parent.max_iterations
        try:
            # asyncio.timeout, not wait_for, which on Python 3.11 may drop the turn's cancellation.
            async with asyncio.timeout(budget):
                outcome = await self.run(child, depth=ctx.depth + 1, parent_event=parent_event)
        except TimeoutError:
            raise HelperError(f"sabre_call: the sub-task did not finish within {budget:g} s") from None
        for field_name in ("input_tokens", "output_tokens", "llm_calls", "iterations"):
            setattr(
                ctx.usage, field_name, getattr(ctx.usage, field_name) + getattr(outcome.usage, field_name)
            )
        if outcome.status != "completed":
            reason = outcome.error.message if outcome.error else outcome.status
            raise HelperError(f"sabre_call: the sub-task did not complete: {reason}")
        return outcome.output or ""

    def _prepare_block(self, turn: TurnInput, snapshot: bytes | None) -> None:
        """The model opened a block: have the conversation's process ready for it while the
        model writes the code (entered, its snapshot restored), unless one is live already.

        Only with a snapshot to restore: without one a fresh child is about as quick, and a
        readying the block overtakes (a model that answers at once) costs the block a round trip
        more (``bench/runtime_bench.py``: prepared rows)."""
        if not snapshot:
            return
        names = _block_names(turn.tools)
        try:
            self._pool.prepare(
                snapshot=snapshot, workdir=turn.workdir, limits=turn.limits, tenant=turn.tenant, **names
            )
        except (OSError, ValueError) as exc:  # the block will say what is wrong, if anything is
            log.warning("block_prepare_failed", turn_id=turn.turn_id, error=str(exc))

    async def _on_call(
        self,
        ctx: HelperContext,
        tools: ToolRegistry,
        call: HelperCall,
        *,
        events: TurnRecorder | None = None,
        parent: str | None = None,
    ) -> CallReply:
        """Answer a call the sandboxed code made (recording ``helper.started``/``completed`` around
        the parent-side ones; an external call is recorded as ``tool_calls.pending`` by the loop)."""
        if call.runs == "caller":
            return await self._answer(ctx, tools, call)
        if events is None:
            return await tracing.traced("helper", {"sabre.helper": call.name}, self._answer(ctx, tools, call))
        started = events.emit("helper.started", {"name": call.name, "line": call.line}, parent=parent)
        ctx.current_event = started
        try:
            reply = await tracing.traced(
                "helper", {"sabre.helper": call.name}, self._answer(ctx, tools, call)
            )
        finally:
            ctx.current_event = None
        data: dict[str, Any] = {"name": call.name, "status": "error" if reply.kind == "error" else "ok"}
        if reply.kind == "error":
            data["error"] = f"{reply.error_type}: {reply.error_message}"
        events.emit("helper.completed", data, parent=started)
        return reply

    async def _answer(self, ctx: HelperContext, tools: ToolRegistry, call: HelperCall) -> CallReply:
        """Run a parent-side helper or tool, or say that an external call suspends the block."""
        if call.runs == "caller":
            tool = tools.get(call.name)
            if tool is None:
                return CallReply(kind="error", error_type="NameError", error_message=f"no tool {call.name!r}")
            problem = tool.validate_arguments(call.arguments)
            if problem is not None:
                # The model sees this inside its block and can fix the call; the caller never does.
                return CallReply(kind="error", error_type="ToolArgumentError", error_message=problem)
            return CallReply(kind="suspend")
        tool = tools.get(call.name)
        if tool is not None and tool.handler is not None:
            return await _call_internal_tool(tool, call)
        spec = HELPERS.get(call.name)
        if spec is None or spec.handler is None:
            return CallReply(kind="error", error_type="NameError", error_message=f"no helper {call.name!r}")
        try:
            value: Any = await spec.handler(ctx, call.args, call.kwargs)
        except HelperError as exc:
            return CallReply(kind="error", error_type="HelperError", error_message=str(exc))
        except LLMError as exc:
            return CallReply(kind="error", error_type="LLMError", error_message=exc.message)
        except Exception as exc:  # a helper's bug on hostile input fails the call, never the turn
            log.warning("helper_failed", helper=call.name, error=type(exc).__name__, exc_info=True)
            return CallReply(
                kind="error", error_type="HelperError", error_message=f"{call.name} failed: {exc}"
            )
        return CallReply(kind="value", value=value)

    def _result_message(self, outcome: BlockOutcome, *, note: str | None) -> TranscriptMessage:
        file_ids = [new_id("file") for _ in outcome.figures]
        text = render_helpers_result(outcome, max_chars=self._max_output_chars, note=note, file_ids=file_ids)
        part = HelpersResultPart(status=outcome.status, text=text, dropped=outcome.dropped, files=file_ids)
        return TranscriptMessage(role="user", parts=[part], images=list(outcome.figures))


async def _call_internal_tool(tool: Tool, call: HelperCall) -> CallReply:
    """Run a service-side tool with schema-checked arguments; its failures become ToolError in the code."""
    try:
        arguments = tool.bind(call.args, call.kwargs)
    except TypeError as exc:
        return CallReply(kind="error", error_type="TypeError", error_message=str(exc))
    problem = tool.validate_arguments(arguments)
    if problem is not None:
        return CallReply(kind="error", error_type="ToolArgumentError", error_message=problem)
    assert tool.handler is not None
    try:
        value = await tool.handler(arguments)
    except HelperError as exc:
        return CallReply(kind="error", error_type="ToolError", error_message=str(exc))
    except Exception as exc:  # a tool's bug is reported to the model, never crashes the turn
        log.warning("internal_tool_failed", tool=tool.name, error=type(exc).__name__)
        return CallReply(kind="error", error_type="ToolError", error_message=f"{tool.name} failed: {exc}")
    return CallReply(kind="value", value=value)


class TurnCancelled(Exception):
    """The turn's cancel signal fired while it waited on the model or a block."""


async def _unless_cancelled(work: Awaitable[T], cancel: asyncio.Event | None) -> T:
    """``work``'s result, unless ``cancel`` is set first: then ``work`` is cancelled (closing the
    model's stream, killing the block) and ``TurnCancelled`` is raised."""
    if cancel is None:
        return await work
    if cancel.is_set():
        if asyncio.iscoroutine(work):
            work.close()
        raise TurnCancelled
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
    finally:
        waiter.cancel()
        if not task.done():
            # The signal fired, or this turn's own task was cancelled (its job worker stopping, its
            # request gone): the work ends either way, and is waited for, so that a block's process
            # is gone before the turn can run again elsewhere. A cancellation of this task is not
            # swallowed here: it is no ``TurnCancelled``, which only the turn's signal means.
            task.cancel()
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # how the cancelled work ended is of no interest (and not logged)
    raise TurnCancelled


class _BlockNames(TypedDict):
    """The names a turn's blocks get, as ``RuntimePool.run_block`` and ``prepare`` take them."""

    internal_helpers: list[str]
    external_tools: dict[str, list[str]]
    sandbox_tools: list[SandboxTool]


def _block_names(tools: ToolRegistry) -> _BlockNames:
    return {
        "internal_helpers": [*SERVICE_HELPERS, *(t.name for t in tools.run_by("service"))],
        "external_tools": {t.name: t.param_names for t in tools.run_by("caller")},
        "sandbox_tools": list(tools.sandbox_tools()),
    }


def _watch_for_block(forward: DeltaCallback | None, opened: Callable[[], None]) -> DeltaCallback:
    """The model's text as it streams, passed on to ``forward``; ``opened`` is called once, as
    soon as the text opens a ``<helpers>`` block (the tag may straddle two pieces)."""
    tail: str | None = ""  # None once the block opened

    async def on_delta(text: str) -> None:
        nonlocal tail
        if tail is not None:
            window = tail + text
            if OPEN in window:
                tail = None
                opened()
            else:
                tail = window[-(len(OPEN) - 1) :]
        if forward is not None:
            await forward(text)

    return on_delta


def _delta_sink(events: TurnRecorder | None, parent: str | None) -> DeltaCallback | None:
    """The model's text as it streams, recorded as ``llm.delta`` under its ``llm.started``."""
    if events is None or parent is None:
        return None

    async def on_delta(text: str) -> None:
        events.delta(text, parent=parent)

    return on_delta


def _images(messages: Sequence[TranscriptMessage]) -> dict[int, list[str]]:
    """This turn's figures as data URLs, by message index, for models that take images."""
    return {
        index: ["data:image/png;base64," + base64.b64encode(png).decode() for png in message.images]
        for index, message in enumerate(messages)
        if message.images
    }


def _finish(
    status: TurnStatus,
    output: str | None,
    ctx: HelperContext,
    messages: list[TranscriptMessage],
    snapshot: bytes | None,
    *,
    error: TurnError | None = None,
) -> TurnOutcome:
    return TurnOutcome(
        status=status, output=output, error=error, usage=ctx.usage, messages=messages, snapshot=snapshot
    )


def _assistant_message(segments: Sequence[Any]) -> TranscriptMessage:
    """The model's answer as parts: prose as text, each block as a helpers part."""
    parts: list[TextPart | HelpersPart] = []
    for segment in segments:
        if segment.kind == "block":
            parts.append(HelpersPart(code=segment.content, closed=segment.closed))
        elif segment.content.strip():
            parts.append(TextPart(text=segment.content))
    return TranscriptMessage(role="assistant", parts=list(parts))


__all__ = ["TurnError", "TurnInput", "TurnLoop", "TurnOutcome", "TurnStatus"]
