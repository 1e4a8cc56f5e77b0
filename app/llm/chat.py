"""LLM client over Chat Completions (`POST /v1/chat/completions`), always streaming.

This is the API local and proxy servers speak (vLLM, Ollama, llama.cpp, LiteLLM). The request
carries `stop=["</helpers>"]`, so a conforming server stops by itself and drops the stop string; the
client then puts the tag back. A server that ignores `stop` is cut on the client side instead.
Events are the SDK's `ChatCompletionChunk`, read as plain dicts (see
`OpenAICompatibleClient.stream_events` for why).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import aclosing

from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionContentPartImageParam,
    ChatCompletionContentPartTextParam,
    ChatCompletionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionUserMessageParam,
)

from app.llm.base import HELPERS_CLOSE, HELPERS_OPEN, LLMMessage
from app.llm.openai_common import (
    OpenAICompatibleClient,
    StreamOutcome,
    TextCollector,
    as_dict,
    as_int,
)


def to_chat_messages(instructions: str, messages: Sequence[LLMMessage]) -> list[ChatCompletionMessageParam]:
    """The instructions as a leading system message, then the messages; images as `image_url` parts."""
    out: list[ChatCompletionMessageParam] = []
    if instructions:
        out.append(ChatCompletionSystemMessageParam(role="system", content=instructions))
    for message in messages:
        if message.role == "system":
            out.append(ChatCompletionSystemMessageParam(role="system", content=message.content))
        elif message.role == "assistant":
            out.append(ChatCompletionAssistantMessageParam(role="assistant", content=message.content))
        elif message.images:
            parts: list[ChatCompletionContentPartTextParam | ChatCompletionContentPartImageParam] = [
                {"type": "text", "text": message.content}
            ]
            parts.extend({"type": "image_url", "image_url": {"url": url}} for url in message.images)
            out.append(ChatCompletionUserMessageParam(role="user", content=parts))
        else:
            out.append(ChatCompletionUserMessageParam(role="user", content=message.content))
    return out


def has_unclosed_helpers(text: str) -> bool:
    """True when the last `<helpers>` in the text has no `</helpers>` after it."""
    opened = text.rfind(HELPERS_OPEN)
    return opened >= 0 and text.find(HELPERS_CLOSE, opened) < 0


class ChatClient(OpenAICompatibleClient):
    """`LLMClient` over Chat Completions (OpenAI-compatible servers)."""

    api_name = "Chat Completions"

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
        body: dict[str, object] = {
            "model": model,
            "messages": to_chat_messages(instructions, messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if stop_at_helpers:
            body["stop"] = [HELPERS_CLOSE]
        finish_reason: object = None
        async with aclosing(self.stream_events("/chat/completions", body)) as events:
            async for chunk in events:
                usage = chunk.get("usage")
                if isinstance(usage, dict):
                    outcome.input_tokens = as_int(usage.get("prompt_tokens"))
                    outcome.output_tokens = as_int(usage.get("completion_tokens"))
                    outcome.finished = True
                choices = chunk.get("choices")
                for choice in choices if isinstance(choices, list) else []:
                    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                        continue
                    content = as_dict(choice.get("delta")).get("content")
                    if content is not None and not isinstance(content, str):
                        raise self.bad_response("a chunk whose content is not text")
                    if content and await collector.feed(content):
                        return  # the server ignored `stop`: closing the stream ends generation
                    if choice.get("finish_reason") is not None:
                        finish_reason = choice["finish_reason"]
                        outcome.finished = True

        # A conforming server drops the stop string; put it back so the block is well formed.
        if stop_at_helpers and finish_reason == "stop" and has_unclosed_helpers(collector.text):
            await collector.append_closing_tag()
