"""The turn loop: model → ``<helpers>`` block → sandbox → ``<helpers_result>`` → model, until an answer.

This is the hot path of the service and reads top to bottom: ``TurnLoop.run`` is one turn. It knows
nothing of HTTP or the store: it gets the transcript and snapshot in, and gives new messages, the new
snapshot and the outcome back (the conversations service persists them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from app.helpers import HELPERS, PARENT_HELPERS, HelperContext, HelperError, Usage
from app.llm.base import LLMClient, LLMError
from app.orchestrator.messages import (
    HelpersPart,
    HelpersResultPart,
    TextPart,
    TranscriptMessage,
)
from app.orchestrator.parser import blocks, parse, prose
from app.orchestrator.render import render_helpers_result, to_llm_messages
from app.runtime import BlockOutcome, CallReply, HelperCall, JournalEntry, Limits, RuntimePool

log = structlog.get_logger(__name__)

TurnStatus = Literal["completed", "awaiting_tool_results", "failed"]


@dataclass(frozen=True, slots=True)
class TurnError:
    """Why a turn failed: a stable code, a readable message, and whether retrying can help."""

    code: str
    message: str
    retryable: bool = False


@dataclass(slots=True)
class TurnInput:
    """What one turn needs: the conversation as stored, and the new user message."""

    conversation_id: str
    turn_id: str
    system_prompt: str
    model: str
    history: Sequence[TranscriptMessage]
    new_messages: list[TranscriptMessage]
    snapshot: bytes | None
    max_iterations: int
    workdir: Path
    limits: Limits


@dataclass(slots=True)
class TurnOutcome:
    """What one turn produced; the caller persists all of it in one transaction."""

    status: TurnStatus
    output: str | None
    error: TurnError | None
    usage: Usage
    messages: list[TranscriptMessage]
    snapshot: bytes | None
    warnings: list[str] = field(default_factory=list)


class TurnLoop:
    """Runs turns with one LLM client and one sandbox pool (both owned by the app's lifespan)."""

    def __init__(self, *, llm: LLMClient, pool: RuntimePool, max_output_chars: int) -> None:
        self._llm = llm
        self._pool = pool
        self._max_output_chars = max_output_chars

    async def run(self, turn: TurnInput) -> TurnOutcome:
        """Run one turn to completion, failure or ``max_iterations``."""
        ctx = HelperContext(llm=self._llm, model=turn.model)
        messages = list(turn.new_messages)
        snapshot = turn.snapshot
        last_prose: str | None = None

        for _ in range(turn.max_iterations):
            ctx.usage.iterations += 1
            try:
                response = await self._llm.complete(
                    model=turn.model,
                    instructions=turn.system_prompt,
                    messages=to_llm_messages([*turn.history, *messages]),
                )
            except LLMError as exc:
                log.warning("llm_failed", turn_id=turn.turn_id, code=exc.code)
                error = TurnError(code=exc.code, message=exc.message, retryable=exc.retryable)
                return self._finish("failed", last_prose, ctx, messages, snapshot, error=error)
            ctx.usage.add_llm(response.usage)

            segments = parse(response.text)
            code_blocks = blocks(segments)
            last_prose = prose(segments)
            messages.append(_assistant_message(segments))
            if not code_blocks:
                return self._finish("completed", last_prose, ctx, messages, snapshot)

            outcome = await self._pool.run_block(
                code=code_blocks[0].content,
                snapshot=snapshot,
                workdir=turn.workdir,
                limits=turn.limits,
                internal_helpers=PARENT_HELPERS,
                external_tools={},
                journal=(),
                on_call=lambda call: self._on_call(ctx, call),
            )
            if outcome.snapshot is not None:
                snapshot = outcome.snapshot
            note = (
                "Only the first <helpers> block of your message was run: write one block at a time."
                if len(code_blocks) > 1
                else None
            )
            messages.append(self._result_message(outcome, note=note))

        error = TurnError(
            code="max_iterations_reached",
            message=f"The model did not finish within max_iterations={turn.max_iterations}.",
        )
        return self._finish("failed", last_prose, ctx, messages, snapshot, error=error)

    async def _on_call(self, ctx: HelperContext, call: HelperCall) -> CallReply:
        """Answer a helper call the sandboxed code made (parent-side helpers only)."""
        spec = HELPERS.get(call.name)
        if spec is None or spec.handler is None:
            return CallReply(kind="error", error_type="NameError", error_message=f"no helper {call.name!r}")
        try:
            value: Any = await spec.handler(ctx, call.args, call.kwargs)
        except HelperError as exc:
            return CallReply(kind="error", error_type="HelperError", error_message=str(exc))
        except LLMError as exc:
            return CallReply(kind="error", error_type="LLMError", error_message=exc.message)
        return CallReply(kind="value", value=value)

    def _result_message(self, outcome: BlockOutcome, *, note: str | None) -> TranscriptMessage:
        text = render_helpers_result(outcome, max_chars=self._max_output_chars, note=note)
        part = HelpersResultPart(status=outcome.status, text=text, dropped=outcome.dropped)
        return TranscriptMessage(role="user", parts=[part])

    @staticmethod
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
            status=status,
            output=output,
            error=error,
            usage=ctx.usage,
            messages=messages,
            snapshot=snapshot,
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


__all__ = ["JournalEntry", "TurnError", "TurnInput", "TurnLoop", "TurnOutcome", "TurnStatus"]
