"""Tool-call replies for the scripted model, so that a function-calling agent can run on it.

``app/llm/scripted.py`` answers with text only: SABRE's model asks for tools by writing code. The
LangGraph build of DESIGN §9 (``bench/langgraph_app.py``) asks the way a LangGraph user's model does,
with Chat Completions ``tool_calls``. ``ToolCallingScriptedLLM`` is the same scripted server (same
queue, responder, recording and ``time_spent``) whose responder may also return a ``ToolCallReply``,
which goes out as an assistant message carrying ``tool_calls`` (streamed or not); every other reply is
answered by the base server unchanged, so SABRE and LangGraph share one model server in a run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, Self

from pydantic import BaseModel, Field

from app.llm.scripted import (
    RecordedRequest,
    Reply,
    ScriptedLLM,
    _chat_usage,
    _Handler,
    _include_usage,
    _new_id,
    _Usage,
)


class ScriptedToolCall(BaseModel):
    """One function call the scripted model asks for."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCallReply(Reply):
    """A Chat Completions reply whose assistant message asks for ``tool_calls`` (text optional)."""

    tool_calls: list[ScriptedToolCall] = Field(min_length=1)


def _wire_calls(calls: list[ScriptedToolCall]) -> list[dict[str, Any]]:
    return [
        {
            "index": index,
            "id": _new_id("call"),
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for index, call in enumerate(calls)
    ]


def _completion(reply: ToolCallReply, *, model: str, usage: _Usage) -> dict[str, Any]:
    calls = [{k: v for k, v in call.items() if k != "index"} for call in _wire_calls(reply.tool_calls)]
    message = {"role": "assistant", "content": reply.text or None, "refusal": None, "tool_calls": calls}
    return {
        "id": _new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}],
        "usage": _chat_usage(usage),
    }


def _events(reply: ToolCallReply, *, model: str, usage: _Usage | None) -> Iterator[bytes]:
    base = {
        "id": _new_id("chatcmpl"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
    }

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return f"data: {json.dumps({**base, 'choices': [choice], 'usage': None})}\n\n".encode()

    yield chunk({"role": "assistant", "content": reply.text or None}, None)
    yield chunk({"tool_calls": _wire_calls(reply.tool_calls)}, None)
    yield chunk({}, "tool_calls")
    if usage is not None:
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': _chat_usage(usage)})}\n\n".encode()
    yield b"data: [DONE]\n\n"


class _ToolCallHandler(_Handler):
    """The scripted handler, plus ``ToolCallReply`` on the chat endpoint."""

    def _answer(self, request: RecordedRequest, reply: Reply) -> None:
        if not isinstance(reply, ToolCallReply) or reply.status != 200:
            super()._answer(request, reply)
            return
        if request.api != "chat":
            self._send_error(400, "scripted LLM: tool-call replies are served on chat completions only")
            return
        usage = _Usage(
            input_tokens=len(request.all_text) // 4,
            output_tokens=len(json.dumps([c.model_dump() for c in reply.tool_calls])) // 4,
        )
        model = request.model or "scripted"
        if request.stream:
            include = _include_usage(request.body)
            self._send_stream(_events(reply, model=model, usage=usage if include else None), reply)
        else:
            self._send_json(200, _completion(reply, model=model, usage=usage), reply.headers)


class ToolCallingScriptedLLM(ScriptedLLM):
    """``ScriptedLLM`` whose replies may also be ``ToolCallReply``."""

    def start(self) -> Self:
        """Start the base server, then hand its requests to the tool-call-aware handler."""
        super().start()
        # Nothing has the URL yet, so no request has been handled by the base handler.
        server = self._server
        assert server is not None
        server.RequestHandlerClass = _ToolCallHandler
        return self
