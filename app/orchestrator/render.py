"""How the transcript and block outcomes are shown to the model."""

from __future__ import annotations

from collections.abc import Iterable

from app.llm.base import LLMMessage
from app.orchestrator.messages import (
    HelpersPart,
    HelpersResultPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    TranscriptMessage,
)
from app.runtime import BlockOutcome


def render_helpers_result(outcome: BlockOutcome, *, max_chars: int, note: str | None = None) -> str:
    """The ``<helpers_result>`` text for one block, capped at ``max_chars`` of content."""
    sections: list[str] = []
    if outcome.stdout:
        sections.append(outcome.stdout.rstrip("\n"))
    sections.extend(outcome.results)
    if outcome.status == "error" and outcome.error:
        sections.append(outcome.error.rstrip())
    if outcome.status == "limit":
        sections.append(
            f"limit: {outcome.limit} - the block was stopped; variables are as they were before it."
        )
    if outcome.dropped:
        names = ", ".join(outcome.dropped)
        sections.append(f"note: these variables could not be saved between blocks and were dropped: {names}")
    if note:
        sections.append(f"note: {note}")
    body = "\n".join(sections) if sections else "(no output)"
    if len(body) > max_chars:
        cut = len(body) - max_chars
        body = body[:max_chars] + f"\n[... {cut} characters truncated]"
    return body


def to_llm_messages(transcript: Iterable[TranscriptMessage]) -> list[LLMMessage]:
    """The transcript as the model sees it: blocks re-wrapped in their tags, results in theirs."""
    rendered: list[LLMMessage] = []
    for message in transcript:
        chunks: list[str] = []
        for part in message.parts:
            if isinstance(part, TextPart):
                chunks.append(part.text)
            elif isinstance(part, HelpersPart):
                chunks.append(f"<helpers>\n{part.code}\n</helpers>")
            elif isinstance(part, HelpersResultPart):
                chunks.append(f"<helpers_result>\n{part.text}\n</helpers_result>")
            elif isinstance(part, ToolCallPart | ToolResultPart):
                continue  # shown to the model through the block's result, not separately
        if not chunks:
            continue
        content = "".join(chunks) if message.role == "assistant" else "\n".join(chunks)
        if rendered and rendered[-1].role == message.role:
            # Consecutive messages of one role (e.g. a failed turn's input) are merged.
            rendered[-1] = LLMMessage(role=message.role, content=rendered[-1].content + "\n\n" + content)
        else:
            rendered.append(LLMMessage(role=message.role, content=content))
    return rendered
