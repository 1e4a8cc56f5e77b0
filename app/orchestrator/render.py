"""How the transcript and block outcomes are shown to the model."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from app.llm.base import LLMMessage
from app.orchestrator.messages import Role
from app.runtime import BlockOutcome

# The result's own tags, however written: text inside a result (a block's output, a web page, a
# caller's tool result) must not close it early and go on as if the transcript said something else.
# Spacing may be any white space or an invisible format character (zero-width space, joiner, BOM).
_GAP: Final = r"[\s\u200b-\u200f\u2060-\u2064\ufeff]*"
_RESULT_TAG: Final = re.compile(rf"<(?={_GAP}/?{_GAP}helpers_result)", re.IGNORECASE)


def fence_result(body: str) -> str:
    """``body`` with every ``<helpers_result>`` or ``</helpers_result>`` in it written ``&lt;...``,
    so that what a block printed or a tool returned cannot end its ``<helpers_result>`` early and
    pass what follows to the model as the transcript's own text (a prompt injection)."""
    return _RESULT_TAG.sub("&lt;", body)


def render_helpers_result(
    outcome: BlockOutcome, *, max_chars: int, note: str | None = None, file_ids: Sequence[str] = ()
) -> str:
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
    for file_id in file_ids:
        sections.append(f"figure: /v1/files/{file_id}")
    if note:
        sections.append(f"note: {note}")
    body = "\n".join(sections) if sections else "(no output)"
    if len(body) > max_chars:
        cut = len(body) - max_chars
        body = body[:max_chars] + f"\n[... {cut} characters truncated]"
    return body


StoredMessage = tuple[Role, Sequence[Mapping[str, Any]]]
"""A message as stored: its role and its parts as JSON dicts (the history is rendered straight from
these, without building models: it is read on every turn and grows with the conversation)."""


def to_llm_messages(
    transcript: Iterable[StoredMessage],
    *,
    after: Sequence[LLMMessage] = (),
    images: Mapping[int, Sequence[str]] | None = None,
    max_result_chars: int | None = None,
) -> list[LLMMessage]:
    """The transcript as the model sees it: blocks re-wrapped in their tags, results in theirs
    (fenced: ``fence_result``; the store keeps them as they were).

    ``after`` is an already rendered prefix (the history) that the new messages continue;
    ``images`` maps a message's index in ``transcript`` to image URLs to attach to it;
    ``max_result_chars`` caps the results of a seeded history's calls as a block's output is capped.
    """
    rendered = list(after)
    seeded_calls: dict[str, str] = {}  # id -> code of the history's tool calls
    for index, (role, parts) in enumerate(transcript):
        attached = list(images.get(index, ())) if images and role == "user" else []
        chunks: list[str] = []
        for part in parts:
            kind = part["kind"]
            if kind == "text":
                chunks.append(part["text"])
            elif kind == "helpers":
                chunks.append(f"<helpers>\n{part['code']}\n</helpers>")
            elif kind == "helpers_result":
                chunks.append(f"<helpers_result>\n{fence_result(part['text'])}\n</helpers_result>")
            # The code's own tool_call and tool_result parts reach the model through the block's
            # result; a seeded history's are shown as a block of calls and their results.
        seeded = [part for part in parts if part.get("seeded")]
        if seeded and role == "assistant":
            for part in seeded:
                seeded_calls[part["id"]] = part.get("code") or part["name"]
            chunks.append("<helpers>\n" + "\n".join(seeded_calls[p["id"]] for p in seeded) + "\n</helpers>")
        elif seeded:
            body = fence_result(
                "\n".join(_seeded_result(p, seeded_calls.get(p["tool_call_id"], "?")) for p in seeded)
            )
            if max_result_chars is not None and len(body) > max_result_chars:
                body = (
                    body[:max_result_chars] + f"\n[... {len(body) - max_result_chars} characters truncated]"
                )
            chunks.append(f"<helpers_result>\n{body}\n</helpers_result>")
        if not chunks:
            continue
        content = "".join(chunks) if role == "assistant" else "\n".join(chunks)
        if rendered and rendered[-1].role == role:
            # Consecutive messages of one role (e.g. a failed turn's input) are merged.
            previous = rendered[-1]
            rendered[-1] = LLMMessage(
                role=role, content=previous.content + "\n\n" + content, images=[*previous.images, *attached]
            )
        else:
            rendered.append(LLMMessage(role=role, content=content, images=attached))
    return rendered


def _seeded_result(part: Mapping[str, Any], code: str) -> str:
    """One result of a seeded history's tool call, as a line of a ``<helpers_result>``."""
    if part.get("error") is not None:
        return f"{code} raised ToolError: {part['error']}"
    output = part.get("output")
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    return f"{code} returned: {text}"
