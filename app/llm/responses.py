"""LLM client over OpenAI's Responses API (`POST /v1/responses`), always streaming.

The Responses API has no stop sequences, so the cut at `</helpers>` happens here: the stream is
closed as soon as the tag arrives, which also stops the server from generating (and billing) more.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import aclosing

from openai import omit
from openai.types.responses import (
    EasyInputMessageParam,
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseIncompleteEvent,
    ResponseInputMessageContentListParam,
    ResponseInputParam,
    ResponseTextDeltaEvent,
    ResponseUsage,
)

from app.llm.base import LLMError, LLMMessage
from app.llm.openai_common import OpenAICompatibleClient, StreamOutcome, TextCollector


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
        try:
            stream = await self._client.responses.create(
                model=model,
                instructions=instructions or omit,
                input=to_responses_input(messages),
                stream=True,
            )
        except Exception as exc:
            raise self.map_error(exc) from exc

        async with aclosing(self.read_events(stream)) as events:
            async for event in events:
                if isinstance(event, ResponseTextDeltaEvent):
                    if await collector.feed(event.delta):
                        return  # closing the stream stops generation at </helpers>
                elif isinstance(event, (ResponseCompletedEvent, ResponseIncompleteEvent)):
                    outcome.finished = True
                    self._record_usage(event.response.usage, outcome)
                elif isinstance(event, ResponseFailedEvent):
                    error = event.response.error
                    detail = error.message if error is not None else "no reason given"
                    limited = error is not None and "rate_limit" in error.code
                    raise LLMError(
                        "llm_rate_limited" if limited else "llm_unavailable",
                        f"The LLM server at {self._where} failed the response: {self.clean(detail)}",
                        retryable=True,
                    )
                elif isinstance(event, ResponseErrorEvent):
                    raise LLMError(
                        "llm_unavailable",
                        f"The LLM server at {self._where} reported an error: {self.clean(event.message)}",
                        retryable=True,
                    )

    @staticmethod
    def _record_usage(usage: ResponseUsage | None, outcome: StreamOutcome) -> None:
        if usage is not None:
            outcome.input_tokens = usage.input_tokens
            outcome.output_tokens = usage.output_tokens
