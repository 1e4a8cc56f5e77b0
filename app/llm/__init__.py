"""LLM clients (Responses API, Chat Completions) behind one interface; a scripted test server."""

from app.llm.base import (
    LLMApi,
    LLMClient,
    LLMError,
    LLMErrorCode,
    LLMMessage,
    LLMResponse,
    LLMUsage,
    Role,
)
from app.llm.factory import make_llm_client

__all__ = [
    "LLMApi",
    "LLMClient",
    "LLMError",
    "LLMErrorCode",
    "LLMMessage",
    "LLMResponse",
    "LLMUsage",
    "Role",
    "make_llm_client",
]
