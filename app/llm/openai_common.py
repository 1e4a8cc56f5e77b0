"""What the Responses and Chat Completions clients share: retries, error mapping, the helpers cut.

Both clients stream through the official `openai` SDK with the SDK's own retries disabled, so the
retry policy lives in one place: retry 408/409/429/5xx, connection errors and timeouts with
exponential backoff and jitter, but only while no text has been received (a stream that dies
half-way is reported, never silently restarted, because the caller may already have shown the text).
"""

from __future__ import annotations

import asyncio
import functools
import random
import re
import ssl
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import httpx
import openai

from app.llm.base import (
    DEFAULT_MAX_REPLY_CHARS,
    HELPERS_CLOSE,
    DeltaCallback,
    LLMError,
    LLMErrorCode,
    LLMMessage,
    LLMResponse,
    LLMUsage,
)

PLACEHOLDER_API_KEY: Final = "sk-none"
"""Sent when no key is configured: local servers ignore it, but the SDK insists on one."""

_MAX_CONNECT_TIMEOUT: Final = 10.0
_MAX_DETAIL_CHARS: Final = 300


def estimate_tokens(text_length: int) -> int:
    """Roughly four characters a token: used only when the server reports no usage."""
    return text_length // 4


def prompt_chars(instructions: str, messages: Sequence[LLMMessage]) -> int:
    """Characters of prompt text, the basis of the input-token estimate."""
    return len(instructions) + sum(len(m.content) for m in messages)


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class TextCollector:
    """Accumulates streamed text, forwards it to `on_delta` and cuts it after `</helpers>`.

    The tag may straddle two chunks, so the last few characters of the previous chunk are kept and
    searched together with the new one. When the tag is found, only the part of the chunk up to and
    including it is kept and forwarded, so the deltas always concatenate to the final text.
    """

    def __init__(
        self,
        *,
        on_delta: DeltaCallback | None,
        stop_at_helpers: bool,
        max_chars: int = DEFAULT_MAX_REPLY_CHARS,
    ) -> None:
        self._on_delta = on_delta
        self._stop_at_helpers = stop_at_helpers
        self._max_chars = max_chars
        self._chars = 0
        self._parts: list[str] = []
        self._tail = ""
        self._held = ""  # the first half of a surrogate pair, until the next chunk
        self.received = False
        """True once any text arrived: from then on the request must not be retried."""
        self.stopped_at_helpers = False

    @property
    def text(self) -> str:
        return "".join(self._parts)

    async def feed(self, chunk: str) -> bool:
        """Take one chunk; returns True when `</helpers>` was reached and reading must stop."""
        if not chunk or self.stopped_at_helpers:
            return self.stopped_at_helpers
        if self._stop_at_helpers:
            window = self._tail + chunk
            at = window.find(HELPERS_CLOSE)
            if at >= 0:
                # The tag cannot fit in the tail alone, so the cut falls inside this chunk.
                chunk = chunk[: at + len(HELPERS_CLOSE) - len(self._tail)]
                self.stopped_at_helpers = True
            else:
                self._tail = window[-(len(HELPERS_CLOSE) - 1) :]
        await self._emit(chunk)
        return self.stopped_at_helpers

    async def append_closing_tag(self) -> None:
        """Close a block whose `</helpers>` a server dropped because it was a stop string."""
        await self._emit(HELPERS_CLOSE)
        self.stopped_at_helpers = True

    async def finish(self) -> None:
        """The stream ended: a first half of a surrogate pair still waiting for its second half
        will never get it (see ``_emit``)."""
        if self._held:
            await self._emit("", more=False)

    async def _emit(self, chunk: str, *, more: bool = True) -> None:
        # A NUL character (PostgreSQL keeps none in text, and the turn's output is text) and a lone
        # surrogate (a \udXXX escape the server's JSON had alone: no UTF-8 encoder takes it, so
        # neither store nor a response could) are what a model may send that cannot be kept: the
        # replacement character stands for them, in the deltas and the answer alike. A pair the
        # server split across two chunks (its escapes in two events) is joined into its character:
        # a first half at the end of a chunk waits for the next one.
        chunk = self._held + chunk.replace("\x00", "\ufffd")
        self._held = ""
        if not chunk.isascii() and _SURROGATE.search(chunk):
            if more and chunk and "\ud800" <= chunk[-1] <= "\udbff":
                chunk, self._held = chunk[:-1], chunk[-1]
            chunk = chunk.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        self.received = True
        if not chunk:
            return
        self._chars += len(chunk)
        if self._chars > self._max_chars:
            # Before the text is kept or forwarded: what was sent so far stays whole.
            raise LLMError(
                "llm_bad_response",
                f"The LLM server sent a reply of more than {self._max_chars} characters "
                "(SABRE_LLM_MAX_REPLY_CHARS); it was cut off there.",
                retryable=False,
            )
        self._parts.append(chunk)
        if self._on_delta is not None:
            await self._on_delta(chunk)


class StreamOutcome:
    """What one attempt learned besides the text: whether it finished and what it cost."""

    def __init__(self) -> None:
        self.finished = False
        """The server sent its end-of-completion event (finish reason, `response.completed`...)."""
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context per process (loading the CA bundle costs tens of milliseconds a client)."""
    return httpx.create_ssl_context()


class OpenAICompatibleClient(ABC):
    """Base of both clients: owns the `AsyncOpenAI` client, the retry loop and the error mapping."""

    api_name: str = "LLM"

    def __init__(
        self,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float = 120,
        max_retries: int = 3,
        retry_base_delay: float = 0.5,
        retry_max_delay: float = 30.0,
        max_reply_chars: int = DEFAULT_MAX_REPLY_CHARS,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self._max_reply_chars = max_reply_chars
        self._api_key = api_key or PLACEHOLDER_API_KEY
        self._max_retries = max_retries
        self._retry_base_delay = retry_base_delay
        self._retry_max_delay = retry_max_delay
        self._client = openai.AsyncOpenAI(
            api_key=self._api_key,
            base_url=base_url,
            timeout=openai.Timeout(timeout, connect=min(timeout, _MAX_CONNECT_TIMEOUT)),
            max_retries=0,  # ours are the only retries: see the module docstring
            # The SDK's aiohttp transport: the same API, errors and proxies from the environment,
            # at about half the CPU of its default httpx transport per streamed completion
            # (1.34-1.54 -> 0.88-0.91 ms against a local server, 1.6-3.0 -> 1.2 ms wall).
            http_client=openai.DefaultAioHttpClient(verify=_tls_context()),
        )
        self._where = _redact_url(str(self._client.base_url))

    async def aclose(self) -> None:
        """Release the HTTP connection pool."""
        await self._client.close()

    async def complete(
        self,
        *,
        model: str,
        instructions: str,
        messages: Sequence[LLMMessage],
        on_delta: DeltaCallback | None = None,
        stop_at_helpers: bool = True,
    ) -> LLMResponse:
        """Stream one completion, retrying transient failures that happen before any text.

        Usage comes from the stream's usage event. When the server sends none (some local servers,
        or a stream closed early at `</helpers>` before the usage event), tokens are estimated as
        characters // 4 rather than reported as 0, so budgets and metrics stay meaningful.
        """
        attempt = 0
        while True:
            collector = TextCollector(
                on_delta=on_delta, stop_at_helpers=stop_at_helpers, max_chars=self._max_reply_chars
            )
            outcome = StreamOutcome()
            try:
                await self._stream_once(
                    model=model,
                    instructions=instructions,
                    messages=messages,
                    stop_at_helpers=stop_at_helpers,
                    collector=collector,
                    outcome=outcome,
                )
            except LLMError as err:
                if not err.retryable or collector.received or attempt >= self._max_retries:
                    raise self._final_error(err, attempts=attempt + 1, mid_stream=collector.received) from err
                retry_after = err.retry_after if isinstance(err, _StatusError) else None
                await asyncio.sleep(self._backoff(attempt, retry_after=retry_after))
                attempt += 1
                continue
            await collector.finish()
            return self._response(
                collector=collector, outcome=outcome, instructions=instructions, messages=messages
            )

    @abstractmethod
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
        """Make one request and read its stream into `collector` and `outcome`.

        Raises `LLMError` (through `self.map_error`) for anything that went wrong on the wire.
        """

    def _response(
        self,
        *,
        collector: TextCollector,
        outcome: StreamOutcome,
        instructions: str,
        messages: Sequence[LLMMessage],
    ) -> LLMResponse:
        text = collector.text
        if not text and not outcome.finished and not collector.stopped_at_helpers:
            raise self.bad_response("a stream that ended without any text or completion event")
        input_tokens = outcome.input_tokens
        if input_tokens is None:
            input_tokens = estimate_tokens(prompt_chars(instructions, messages))
        output_tokens = outcome.output_tokens
        if output_tokens is None:
            output_tokens = estimate_tokens(len(text))
        return LLMResponse(
            text=text,
            usage=LLMUsage(input_tokens=input_tokens, output_tokens=output_tokens),
            stopped_at_helpers=collector.stopped_at_helpers,
        )

    async def stream_events(self, path: str, body: dict[str, object]) -> AsyncGenerator[dict[str, Any], None]:
        """POST `body` to `path` and yield its server-sent events as JSON objects.

        The SDK does the HTTP, auth, status errors and SSE decoding, but its typed `create()` is
        bypassed for its generic `post()`: the typed path re-walks every message through its
        TypedDict transform and builds a pydantic model per event, which measured 2-5 ms per
        completion against a local server, more than the rest of a SABRE request. Events are read
        as plain dicts with the fields and event names of the SDK's own types.

        Wire failures become `LLMError`; only the SDK's work is guarded, so an exception raised by
        the caller's `on_delta` while the consumer handles an event passes through unchanged.
        The stream is always closed, which is also how generation is stopped early.
        """
        try:
            stream = await self._client.post(
                path,
                cast_to=object,
                body=body,
                options={"security": {"bearer_auth": True}},
                stream=True,
                stream_cls=openai.AsyncStream[object],
            )
        except Exception as exc:
            raise self.map_error(exc) from exc
        iterator = stream.__aiter__()
        try:
            while True:
                try:
                    event = await iterator.__anext__()
                except StopAsyncIteration:
                    return
                except Exception as exc:
                    raise self.map_error(exc, streaming=True) from exc
                if not isinstance(event, dict):
                    raise self.bad_response("an event that is not a JSON object")
                yield event
        finally:
            await stream.close()

    def bad_response(self, what: str) -> LLMError:
        """The server answered, but not in the shape of the API: retrying will not help."""
        return LLMError(
            "llm_bad_response",
            f"The LLM server at {self._where} sent {what} (not valid {self.api_name} output).",
            retryable=False,
        )

    def map_error(self, exc: BaseException, *, streaming: bool = False) -> LLMError:
        """Turn an SDK, transport or decoding failure into an `LLMError` with a stable code.

        `streaming`: the failure happened while reading an accepted stream, not while connecting.
        """
        if isinstance(exc, LLMError):
            return exc
        if isinstance(exc, openai.APIStatusError):
            return self._status_error(exc)
        # The aiohttp transport reports a refused or failed connect as a connect timeout: the cause
        # chain tells which it was.
        if isinstance(exc, openai.APITimeoutError) and not _connection_reason(exc):
            return LLMError("llm_unavailable", f"The LLM server at {self._where} timed out.", retryable=True)
        if isinstance(exc, openai.APIConnectionError):
            reason = _connection_reason(exc)
            message = (
                f"The connection to the LLM server at {self._where} broke during the stream{reason}."
                if streaming
                else f"Could not reach the LLM server at {self._where}{reason}."
            )
            return LLMError("llm_unavailable", message, retryable=True)
        if isinstance(exc, openai.APIError):
            # An error object in the middle of a stream: the server failed after accepting the call.
            return LLMError(
                "llm_unavailable",
                f"The LLM server at {self._where} reported an error: {self.clean(exc.message)}",
                retryable=True,
            )
        if isinstance(exc, ValueError):  # JSONDecodeError and UnicodeDecodeError among them
            return self.bad_response("a stream that is not server-sent events of JSON")
        return LLMError(
            "llm_unavailable",
            f"The call to the LLM server at {self._where} failed ({type(exc).__name__}).",
            retryable=True,
        )

    def _status_error(self, exc: openai.APIStatusError) -> LLMError:
        status = exc.status_code
        detail = _error_detail(exc.body)
        suffix = f": {self.clean(detail)}" if detail else "."
        retry_after = _retry_after_seconds(exc)
        if status == 429:
            return _StatusError(
                "llm_rate_limited",
                f"The LLM server at {self._where} is rate limiting requests (HTTP 429){suffix}",
                retryable=True,
                retry_after=retry_after,
            )
        if status >= 500 or status in (408, 409):
            return _StatusError(
                "llm_unavailable",
                f"The LLM server at {self._where} failed (HTTP {status}){suffix}",
                retryable=True,
                retry_after=retry_after,
            )
        if status in (401, 403):
            # The service's own key is wrong: not the API client's fault, and retrying won't help.
            return LLMError(
                "llm_unavailable",
                f"The LLM server at {self._where} refused the configured API key (HTTP {status}){suffix}",
                retryable=False,
            )
        return LLMError(
            "llm_bad_request",
            f"The LLM server at {self._where} rejected the request (HTTP {status}){suffix}",
            retryable=False,
        )

    def _final_error(self, err: LLMError, *, attempts: int, mid_stream: bool) -> LLMError:
        """The error the caller sees, saying why it was not (or no longer) retried."""
        if mid_stream and err.code in ("llm_unavailable", "llm_rate_limited"):
            # Not retried here: the caller may already have shown the text that arrived.
            return LLMError(
                "llm_unavailable",
                f"{err.message.rstrip('.')}; text had already been received, so it was not retried.",
                retryable=True,
            )
        if attempts > 1:
            return LLMError(
                err.code,
                f"{err.message.rstrip('.')} (gave up after {attempts} attempts).",
                retryable=err.retryable,
            )
        return err

    def _backoff(self, attempt: int, *, retry_after: float | None) -> float:
        """Exponential backoff with equal jitter; a server's Retry-After wins when it is longer."""
        ceiling = min(self._retry_base_delay * 2.0**attempt, self._retry_max_delay)
        delay = ceiling / 2 + random.uniform(0, ceiling / 2)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self._retry_max_delay))
        return delay

    def clean(self, text: str) -> str:
        """One readable line, never containing the API key."""
        line = " ".join(text.split())
        if self._api_key != PLACEHOLDER_API_KEY:
            line = line.replace(self._api_key, "***")
        if len(line) > _MAX_DETAIL_CHARS:
            line = line[: _MAX_DETAIL_CHARS - 1] + "…"
        return line


class _StatusError(LLMError):
    """An HTTP error status, remembering the server's Retry-After for the backoff."""

    def __init__(
        self, code: LLMErrorCode, message: str, *, retryable: bool, retry_after: float | None
    ) -> None:
        super().__init__(code, message, retryable=retryable)
        self.retry_after = retry_after


def as_dict(value: object) -> dict[str, Any]:
    """A JSON object field, or an empty dict when it is missing or null."""
    return value if isinstance(value, dict) else {}


def as_int(value: object) -> int | None:
    """A token count, if the server sent one (booleans are not counts)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _error_detail(body: object) -> str:
    """The human part of an error body: `{"error": {"message": ...}}`, `{"message": ...}`, text."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            message = inner.get("message") or inner.get("detail")
            return message if isinstance(message, str) else ""
        return inner if isinstance(inner, str) else ""
    if isinstance(body, str):
        return body
    return ""


def _retry_after_seconds(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare for LLM servers, the backoff is good enough
    return seconds if seconds >= 0 else None


def _connection_reason(exc: openai.APIConnectionError) -> str:
    """A short cause such as ' (connection refused)', found along the exception chain."""
    seen: BaseException | None = exc.__cause__ or exc.__context__
    for _ in range(8):  # the chain is short; the bound only guards against a pathological one
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError):
            return " (connection refused)"
        text = str(seen).lower()
        if "refused" in text:
            return " (connection refused)"
        if "name or service not known" in text or "nodename nor servname" in text:
            return " (unknown host)"
        if "reset" in text:
            return " (connection reset)"
        if "incomplete" in text or "closed" in text or "disconnected" in text:
            return " (connection closed by the server)"
        seen = seen.__cause__ or seen.__context__
    return ""


def _redact_url(url: str) -> str:
    """The base URL without credentials or query, safe to show to API clients."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
