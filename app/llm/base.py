"""The one interface every LLM client implements, and the types it speaks.

The orchestrator only ever sees `LLMClient`, `LLMMessage`, `LLMResponse` and `LLMError`; which wire
API (Responses or Chat Completions) sits behind it is configuration.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Literal, Protocol, Self

from pydantic import BaseModel, Field, model_validator

Role = Literal["system", "user", "assistant"]
LLMErrorCode = Literal["llm_unavailable", "llm_rate_limited", "llm_bad_response", "llm_bad_request"]
LLMApi = Literal["responses", "chat"]
DeltaCallback = Callable[[str], Awaitable[None]]

# One model reply's text, at most, unless configured (``SABRE_LLM_MAX_REPLY_CHARS``).
DEFAULT_MAX_REPLY_CHARS: Final = 1_000_000

HELPERS_OPEN = "<helpers>"
HELPERS_CLOSE = "</helpers>"


class LLMMessage(BaseModel):
    """One message of the conversation sent to the model.

    `images` are URLs (normally `data:image/png;base64,...`) attached to a user message; only user
    messages may carry them, because neither wire API accepts images from other roles.
    """

    role: Role
    content: str
    images: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _images_only_on_user(self) -> Self:
        if self.images and self.role != "user":
            raise ValueError("only user messages can carry images")
        return self


class LLMUsage(BaseModel):
    """Tokens billed for one completion (estimated when the server reports none)."""

    input_tokens: int = 0
    output_tokens: int = 0


class LLMResponse(BaseModel):
    """The text of one completion.

    `stopped_at_helpers` is True when generation was cut at `</helpers>`: the text then ends with
    that tag and the caller should run the block before asking the model to continue.
    """

    text: str
    usage: LLMUsage
    stopped_at_helpers: bool


class LLMError(Exception):
    """A failed completion, with a stable code and whether trying again later can help.

    The message is meant for API clients: plain words, no Python reprs, never a credential.
    """

    code: LLMErrorCode
    retryable: bool
    message: str

    def __init__(self, code: LLMErrorCode, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable

    def __repr__(self) -> str:
        return f"LLMError(code={self.code!r}, retryable={self.retryable}, message={self.message!r})"


class LLMClient(Protocol):
    """Streams one completion from a model.

    `on_delta` is awaited with every piece of text as it arrives; the pieces concatenate to exactly
    `LLMResponse.text`. With `stop_at_helpers` the completion ends right after the first
    `</helpers>`, because the model must see the block's result before it goes on.
    """

    async def complete(
        self,
        *,
        model: str,
        instructions: str,
        messages: Sequence[LLMMessage],
        on_delta: DeltaCallback | None = None,
        stop_at_helpers: bool = True,
    ) -> LLMResponse: ...

    async def aclose(self) -> None: ...
