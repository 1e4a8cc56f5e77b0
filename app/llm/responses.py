"""LLM client over OpenAI's Responses API (`POST /v1/responses`), always streaming.

The Responses API has no stop sequences, so the cut at `</helpers>` happens here: the stream is
closed as soon as the tag arrives, which also stops the server from generating (and billing) more.
Events are those of the SDK's `ResponseStreamEvent` union, read as plain dicts (see
`OpenAICompatibleClient.stream_events` for why): `response.output_text.delta` carries text,
`response.completed` / `response.incomplete` carry `response.usage`, `response.failed` and
`error` report a failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

from openai.types.responses import (
    EasyInputMessageParam,
    ResponseInputMessageContentListParam,
    ResponseInputParam,
)

from app.llm.base import LLMError, LLMMessage
from app.llm.openai_common import (
    OpenAICompatibleClient,
    StreamOutcome,
    TextCollector,
    as_dict,
    as_int,
)


def to_responses_input(messages: Sequence[LLMMessage]) -> ResponseInputParam:
    """Messages in the Responses shape; a user message with images gets a content-part list."""
    items: ResponseInputParam = []
    for message in messages:
        if message.images:
            parts: ResponseInputMessageContentListParam = [{"type": "input_text", "text": message.content}]
            parts.extend(
                {"type": "input_image", "image_url": url, "detail": "auto"} for url in message.images
            )
            items.append(EasyInputMessageParam(role=message.role, content=parts))
        else:
            items.append(EasyInputMessageParam(role=message.role, content=message.content))
    return items


class ResponsesClient(OpenAICompatibleClient):
    """`LLMClient` over the Responses API (OpenAI, and proxies that implement it)."""

    api_name = "Responses API"

    async def _stream_once(
        self,
        *,
        model: str,
        instructions: str,
        messages: Sequence[LLMMessage],
        stop_at_helpers: bool,
        collector: TextCollector,
        outcome: StreamOutcome,
    ) -> None:
        body: dict[str, object] = {"model": model, "input": to_responses_input(messages), "stream": True}
        if instructions:
            body["instructions"] = instructions
        async with aclosing(self.stream_events("/responses", body)) as events:
            async for event in events:
                kind = event.get("type")
                if kind == "response.output_text.delta":
                    delta = event.get("delta")
                    if not isinstance(delta, str):
                        raise self.bad_response("a text delta without text")
                    if await collector.feed(delta):
                        return  # closing the stream stops generation at </helpers>
                elif kind in ("response.completed", "response.incomplete"):
                    outcome.finished = True
                    usage = as_dict(as_dict(event.get("response")).get("usage"))
                    outcome.input_tokens = as_int(usage.get("input_tokens"))
                    outcome.output_tokens = as_int(usage.get("output_tokens"))
                elif kind == "response.failed":
                    raise self._failure(as_dict(as_dict(event.get("response")).get("error")))
                elif kind == "error":
                    raise self._failure(event)

    def _failure(self, error: dict[str, Any]) -> LLMError:
        """A failure the server reports inside the stream, after it accepted the request."""
        message = error.get("message")
        detail = self.clean(message) if isinstance(message, str) and message else "no reason given"
        code = error.get("code")
        limited = isinstance(code, str) and "rate_limit" in code
        return LLMError(
            "llm_rate_limited" if limited else "llm_unavailable",
            f"The LLM server at {self._where} failed the response: {detail}",
            retryable=True,
        )
