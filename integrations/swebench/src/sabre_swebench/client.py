"""The few SABRE calls a runner makes: start a conversation, answer its pending tool calls.

Every POST carries an ``Idempotency-Key``, so a request retried after a dropped connection or a
503 returns the stored answer instead of running the turn twice.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Final

import httpx
from pydantic import BaseModel, Field, ValidationError

RETRY_STATUSES: Final = frozenset({502, 503, 504})
RETRY_DELAYS: Final = (0.5, 1.0, 2.0, 4.0)


class SabreError(RuntimeError):
    """SABRE refused a request or could not be reached: ``status`` 0 for a network failure."""

    def __init__(self, message: str, *, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class PendingCall(BaseModel):
    """One external call the turn waits for."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class TurnError(BaseModel):
    """Why a turn failed."""

    code: str
    message: str
    retryable: bool = False


class Usage(BaseModel):
    """Tokens and model calls of a turn."""

    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0


class Turn(BaseModel):
    """What SABRE answers to a turn-running POST (the fields a runner reads)."""

    conversation_id: str
    turn_id: str
    status: str
    output: str | None = None
    pending_tool_calls: list[PendingCall] = Field(default_factory=list)
    error: TurnError | None = None
    usage: Usage = Field(default_factory=Usage)


class SabreClient:
    """An async client of one SABRE server; ``http`` may be given (tests, shared pools)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 900.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._own = http is None
        self._timeout = timeout
        self._http = http or httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=httpx.Timeout(timeout, connect=10.0)
        )

    async def aclose(self) -> None:
        """Close the connection pool (when this client made it)."""
        if self._own:
            await self._http.aclose()

    async def start(self, body: dict[str, Any]) -> Turn:
        """``POST /v1/conversations``: create a conversation and run its first turn."""
        return await self._post("/v1/conversations", body, what="create")

    async def answer(self, conversation_id: str, results: list[dict[str, Any]]) -> Turn:
        """``POST …/tool-results``: every pending call's ``output`` or ``error`` in one request."""
        path = f"/v1/conversations/{conversation_id}/tool-results"
        return await self._post(path, {"results": results}, what="tool-results")

    async def _post(self, path: str, body: dict[str, Any], *, what: str) -> Turn:
        """POST with retries under one Idempotency-Key: a lost connection or a 502-504 is retried
        (RETRY_DELAYS), and while the first attempt's turn still runs (409 idempotency_in_progress)
        the retry waits for it, up to the client's timeout."""
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        failures = 0
        while True:
            try:
                response = await self._http.post(path, json=body, headers=headers)
            except httpx.TransportError as exc:
                if failures == len(RETRY_DELAYS):
                    raise SabreError(f"{what}: {type(exc).__name__}: {exc}") from None
                await asyncio.sleep(RETRY_DELAYS[failures])
                failures += 1
                continue
            code = _problem_code(response)
            if code == "idempotency_in_progress" and loop.time() < deadline:
                await asyncio.sleep(_retry_after(response, default=2.0))
                continue
            if response.status_code in RETRY_STATUSES and failures < len(RETRY_DELAYS):
                await asyncio.sleep(_retry_after(response, default=RETRY_DELAYS[failures]))
                failures += 1
                continue
            if response.status_code >= 400:
                raise SabreError(
                    f"{what}: {response.status_code} {code}: {_problem_detail(response)}",
                    status=response.status_code,
                    code=code,
                )
            try:
                return Turn.model_validate_json(response.content)
            except ValidationError as exc:
                raise SabreError(f"{what}: unexpected answer: {exc.errors()[0]['msg']}") from None


def _problem_code(response: httpx.Response) -> str:
    if response.status_code < 400:
        return ""
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("code", "")) if isinstance(body, dict) else ""


def _problem_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("title") or "")[:500]
    return ""


def _retry_after(response: httpx.Response, *, default: float) -> float:
    try:
        return min(max(float(response.headers.get("retry-after", default)), 0.0), 30.0)
    except ValueError:
        return default
