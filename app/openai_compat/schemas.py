"""Request and response bodies of the OpenAI Chat Completions face (the subset SABRE serves).

Requests are strict: a field OpenAI defines is accepted (those that steer sampling are ignored: the
persona's model samples as SABRE configures it), anything else is a 422, so a misspelt option never
passes silently. Assistant messages may carry the fields the OpenAI SDK echoes back (``refusal``,
``annotations``, ``audio`` and ``function_call`` as null).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.conversations.schemas import MAX_TOOLS, TOOL_NAME_PATTERN, ToolIn

# A chat request's history: at most this many messages (the body limit bounds their size).
MAX_CHAT_MESSAGES = 2_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChatTextPart(_Strict):
    """A text part of a message's content (images and audio are not supported)."""

    type: Literal["text"]
    text: str


Content = str | Annotated[list[ChatTextPart], Field(max_length=256)]


class SystemMessage(_Strict):
    """A leading system or developer message: the conversation's instructions."""

    role: Literal["system", "developer"]
    content: Content
    name: str | None = Field(default=None, max_length=64)


class UserMessage(_Strict):
    role: Literal["user"]
    content: Content
    name: str | None = Field(default=None, max_length=64)


class FunctionCall(_Strict):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    arguments: str = Field(description="The arguments, as a JSON object in a string.")


class ToolCall(_Strict):
    id: str = Field(min_length=1, max_length=64)
    type: Literal["function"] = "function"
    function: FunctionCall
    # tau2's agent (and litellm's older message shapes) repeat the function's name here: ignored.
    name: str | None = Field(default=None, max_length=64)


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=128)
    name: str | None = Field(default=None, max_length=64)
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None


class ToolMessage(_Strict):
    role: Literal["tool"]
    tool_call_id: str = Field(min_length=1, max_length=64)
    content: Content


ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None


class ChatCompletionRequest(_Strict):
    """``POST /v1/chat/completions``: the whole dialogue, as Chat Completions clients send it."""

    model: str = Field(
        min_length=1,
        max_length=300,
        description="`sabre/<persona>`, optionally `sabre/<persona>:<backing model>` (see GET /v1/models).",
    )
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_CHAT_MESSAGES)
    tools: list[ToolIn] = Field(
        default_factory=list,
        max_length=MAX_TOOLS,
        description="The caller's tools: the code calls them as functions; a call pauses the turn and "
        "comes back as `tool_calls`.",
    )
    tool_choice: Any = Field(default=None, description="Accepted and ignored: the code decides.")
    parallel_tool_calls: bool | None = Field(
        default=None,
        description="Accepted and ignored: independent calls made with `parallel(...)` come together.",
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, ge=1, le=1, description="Only 1.")
    # Accepted and ignored: sampling is the persona's.
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, str] | None = None
    store: bool | None = None
    reasoning_effort: str | None = Field(default=None, max_length=32)
    logprobs: Literal[False] | None = None


# -- responses -----------------------------------------------------------------------------------


class ResponseFunction(BaseModel):
    name: str
    arguments: str


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunction


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ResponseToolCall] | None = None
    refusal: None = None


FinishReason = Literal["stop", "tool_calls"]


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: FinishReason
    logprobs: None = None


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    """The answer: the turn's output (`finish_reason: stop`) or its pending calls (`tool_calls`)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    system_fingerprint: str | None = None


class ChunkFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ChunkToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ChunkFunction | None = None


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    """One ``data:`` line of a streamed answer (the stream ends with ``data: [DONE]``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None


class Model(BaseModel):
    """A persona, as a Chat Completions model."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sabre"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
