"""Builds the configured `LLMClient`: the one place that knows which class serves which API."""

from __future__ import annotations

from app.llm.base import DEFAULT_MAX_REPLY_CHARS, LLMApi, LLMClient


def make_llm_client(
    *,
    api: LLMApi,
    base_url: str | None,
    api_key: str | None,
    timeout: float = 120,
    max_retries: int = 3,
    retry_base_delay: float = 0.5,
    max_reply_chars: int = DEFAULT_MAX_REPLY_CHARS,
) -> LLMClient:
    """A streaming client for `api` at `base_url` (None: the SDK's default, api.openai.com).

    An empty or missing `api_key` is replaced by a placeholder, since local servers need none but
    the SDK refuses to start without one. `max_retries` counts retries after the first attempt;
    `retry_base_delay` is the first backoff in seconds (it doubles each time, with jitter);
    a reply longer than `max_reply_chars` is cut there and fails as `llm_bad_response`.
    """
    # Imported here so that `import app.llm` stays cheap for code that only needs the types.
    if api == "responses":
        from app.llm.responses import ResponsesClient

        return ResponsesClient(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            retry_base_delay=retry_base_delay,
            max_reply_chars=max_reply_chars,
        )
    from app.llm.chat import ChatClient

    return ChatClient(
        base_url=base_url,
        api_key=api_key,
        timeout=timeout,
        max_retries=max_retries,
        retry_base_delay=retry_base_delay,
        max_reply_chars=max_reply_chars,
    )
