"""``Sabre`` and ``AsyncSabre``: the generated operations (``sabre_api``) behind methods that take
plain arguments, return the generated models, raise typed errors and stream with resume."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx
from sabre_api.api.conversations import (
    conversations_create,
    conversations_delete,
    conversations_get,
    conversations_messages_create,
    conversations_messages_list,
    conversations_tool_results_create,
    conversations_turns_cancel,
)
from sabre_api.api.files import files_get
from sabre_api.api.personas import personas_list
from sabre_api.client import AuthenticatedClient
from sabre_api.models.chat_tool import ChatTool
from sabre_api.models.conversation_out import ConversationOut
from sabre_api.models.create_conversation import CreateConversation
from sabre_api.models.create_conversation_metadata import CreateConversationMetadata
from sabre_api.models.message_out import MessageOut
from sabre_api.models.persona_summary import PersonaSummary
from sabre_api.models.post_message import PostMessage
from sabre_api.models.responses_tool import ResponsesTool
from sabre_api.models.tool_error import ToolError
from sabre_api.models.tool_output import ToolOutput
from sabre_api.models.tool_results import ToolResults
from sabre_api.models.turn_out import TurnOut
from sabre_api.types import UNSET, File, Response, Unset

from sabre_client.errors import ConnectionFailed, unwrap
from sabre_client.streaming import AsyncTurnStream, TurnStream

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8011"
Tool = ChatTool | ResponsesTool | Mapping[str, Any]
Results = Mapping[str, Any] | Sequence[ToolOutput | ToolError]


def _tool(tool: Tool) -> ChatTool | ResponsesTool:
    if isinstance(tool, ChatTool | ResponsesTool):
        return tool
    return ChatTool.from_dict(tool) if "function" in tool else ResponsesTool.from_dict(tool)


def _tools(tools: Sequence[Tool] | None) -> list[ChatTool | ResponsesTool] | Unset:
    return UNSET if tools is None else [_tool(t) for t in tools]


def _results(results: Results) -> ToolResults:
    """``{call_id: output}`` (every value an output) or ``ToolOutput``/``ToolError`` items."""
    if isinstance(results, Mapping):
        items: list[ToolOutput | ToolError] = [
            ToolOutput(tool_call_id=call_id, output=output) for call_id, output in results.items()
        ]
    else:
        items = list(results)
    return ToolResults(results=items)


def _create_body(
    text: str,
    *,
    persona: str,
    tools: Sequence[Tool] | None,
    instructions: str | None,
    model: str | None,
    metadata: Mapping[str, Any] | None,
    stream: bool = False,
) -> CreateConversation:
    body = CreateConversation(input_=text, persona=persona, tools=_tools(tools), stream=stream)
    if instructions is not None:
        body.instructions = instructions
    if model is not None:
        body.model = model
    if metadata is not None:
        body.metadata = CreateConversationMetadata.from_dict(dict(metadata))
    return body


def _key_headers(*, idempotency_key: str | None, if_match: str | int | None = None) -> dict[str, str]:
    headers: dict[str, str] = {}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    if if_match is not None:
        headers["If-Match"] = f'"{if_match}"' if isinstance(if_match, int) else if_match
    return headers


def _if_match(value: str | int | None) -> str | Unset:
    if value is None:
        return UNSET
    return f'"{value}"' if isinstance(value, int) else value


def _api_client(base_url: str | None, api_key: str | None, timeout: float) -> AuthenticatedClient:
    url = (base_url or os.environ.get("SABRE_URL") or DEFAULT_URL).rstrip("/")
    key = api_key if api_key is not None else os.environ.get("SABRE_API_KEY")
    if key:
        return AuthenticatedClient(base_url=url, token=key, timeout=httpx.Timeout(timeout, connect=5.0))
    # No key (a local server in open mode): an unused header instead of an empty Authorization.
    return AuthenticatedClient(
        base_url=url,
        token="",
        prefix="",
        auth_header_name="X-Sabre-No-Key",
        timeout=httpx.Timeout(timeout, connect=5.0),
    )


class Sabre:
    """A synchronous client. ``Sabre()`` reads ``SABRE_URL`` (default the local server) and
    ``SABRE_API_KEY``; every method raises an ``ApiError`` subclass for an error answer and
    ``ConnectionFailed`` when the server cannot be reached."""

    def __init__(
        self, base_url: str | None = None, *, api_key: str | None = None, timeout: float = 300.0
    ) -> None:
        self.api = _api_client(base_url, api_key, timeout)
        self.base_url = self.api._base_url

    def __enter__(self) -> Sabre:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self.api.get_httpx_client().close()

    def _call(self, operation: Callable[..., Response[Any]], /, *args: Any, **kwargs: Any) -> Any:
        try:
            return unwrap(operation(*args, client=self.api, **kwargs))
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"cannot reach {self.base_url}: {exc}", url=self.base_url) from exc

    def _stream(
        self, method: str, url: str, body: dict[str, Any] | None, headers: dict[str, str]
    ) -> TurnStream:
        return TurnStream(
            self.api.get_httpx_client(), method=method, url=url, json_body=body, headers=headers
        )

    def personas(self) -> list[PersonaSummary]:
        """Every persona the server offers."""
        return list(self._call(personas_list.sync_detailed).data)

    def create_conversation(
        self,
        text: str,
        *,
        persona: str = "default",
        tools: Sequence[Tool] | None = None,
        instructions: str | None = None,
        model: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> TurnOut:
        """Start a conversation and wait for its first turn."""
        body = _create_body(
            text, persona=persona, tools=tools, instructions=instructions, model=model, metadata=metadata
        )
        turn: TurnOut = self._call(
            conversations_create.sync_detailed, body=body, idempotency_key=idempotency_key or UNSET
        )
        return turn

    def stream_conversation(
        self,
        text: str,
        *,
        persona: str = "default",
        tools: Sequence[Tool] | None = None,
        instructions: str | None = None,
        model: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> TurnStream:
        """Start a conversation; its first turn's events as they happen."""
        body = _create_body(
            text,
            persona=persona,
            tools=tools,
            instructions=instructions,
            model=model,
            metadata=metadata,
            stream=True,
        )
        return self._stream(
            "POST", "/v1/conversations", body.to_dict(), _key_headers(idempotency_key=idempotency_key)
        )

    def send_message(
        self,
        conversation_id: str,
        text: str,
        *,
        tools: Sequence[Tool] | None = None,
        if_match: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> TurnOut:
        """Send the next message and wait for the turn."""
        turn: TurnOut = self._call(
            conversations_messages_create.sync_detailed,
            conversation_id,
            body=PostMessage(input_=text, tools=_tools(tools)),
            if_match=_if_match(if_match),
            idempotency_key=idempotency_key or UNSET,
        )
        return turn

    def stream_message(
        self,
        conversation_id: str,
        text: str,
        *,
        tools: Sequence[Tool] | None = None,
        if_match: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> TurnStream:
        """Send the next message; the turn's events as they happen."""
        body = PostMessage(input_=text, tools=_tools(tools), stream=True).to_dict()
        headers = _key_headers(idempotency_key=idempotency_key, if_match=if_match)
        return self._stream("POST", f"/v1/conversations/{conversation_id}/messages", body, headers)

    def submit_tool_results(
        self,
        conversation_id: str,
        results: Results,
        *,
        if_match: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> TurnOut:
        """Answer the pending tool calls (``{call_id: output}`` or ``ToolOutput``/``ToolError``) and
        wait for the resumed turn."""
        turn: TurnOut = self._call(
            conversations_tool_results_create.sync_detailed,
            conversation_id,
            body=_results(results),
            if_match=_if_match(if_match),
            idempotency_key=idempotency_key or UNSET,
        )
        return turn

    def stream_tool_results(
        self,
        conversation_id: str,
        results: Results,
        *,
        if_match: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> TurnStream:
        """Answer the pending tool calls; the resumed turn's events as they happen."""
        body = _results(results)
        body.stream = True
        headers = _key_headers(idempotency_key=idempotency_key, if_match=if_match)
        return self._stream(
            "POST", f"/v1/conversations/{conversation_id}/tool-results", body.to_dict(), headers
        )

    def follow(self, conversation_id: str, *, last_event_id: str | None = None) -> TurnStream:
        """The conversation's events after ``last_event_id``, then the running turn's, live."""
        headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
        return self._stream("GET", f"/v1/conversations/{conversation_id}/events", None, headers)

    def get_conversation(self, conversation_id: str) -> ConversationOut:
        """The conversation's state: status, version, pending tool calls, usage."""
        conversation: ConversationOut = self._call(conversations_get.sync_detailed, conversation_id)
        return conversation

    def messages(self, conversation_id: str, *, page_size: int = 100) -> Iterator[MessageOut]:
        """The whole transcript, oldest first (fetched page by page)."""
        after = -1
        while True:
            page = self._call(
                conversations_messages_list.sync_detailed, conversation_id, after=after, limit=page_size
            )
            yield from page.data
            if not page.has_more or page.next_after is None:
                return
            after = page.next_after

    def cancel_turn(self, conversation_id: str, turn_id: str, *, wait: float = 10) -> TurnOut:
        """Stop a queued or running turn."""
        turn: TurnOut = self._call(
            conversations_turns_cancel.sync_detailed, conversation_id, turn_id, wait=wait
        )
        return turn

    def delete_conversation(self, conversation_id: str) -> None:
        """Delete the conversation and everything it owns."""
        self._call(conversations_delete.sync_detailed, conversation_id)

    def file(self, file_id: str) -> bytes:
        """The bytes of a file a turn produced (a PNG figure)."""
        found: File = self._call(files_get.sync_detailed, file_id)
        return found.payload.read()


class AsyncSabre:
    """``Sabre`` for asyncio: the same methods, awaited (streams are ``async for``)."""

    def __init__(
        self, base_url: str | None = None, *, api_key: str | None = None, timeout: float = 300.0
    ) -> None:
        self.api = _api_client(base_url, api_key, timeout)
        self.base_url = self.api._base_url

    async def __aenter__(self) -> AsyncSabre:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.api.get_async_httpx_client().aclose()

    async def _call(
        self, operation: Callable[..., Awaitable[Response[Any]]], /, *args: Any, **kwargs: Any
    ) -> Any:
        try:
            return unwrap(await operation(*args, client=self.api, **kwargs))
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"cannot reach {self.base_url}: {exc}", url=self.base_url) from exc

    def _stream(
        self, method: str, url: str, body: dict[str, Any] | None, headers: dict[str, str]
    ) -> AsyncTurnStream:
        return AsyncTurnStream(
            self.api.get_async_httpx_client(), method=method, url=url, json_body=body, headers=headers
        )

    async def personas(self) -> list[PersonaSummary]:
        """Every persona the server offers."""
        return list((await self._call(personas_list.asyncio_detailed)).data)

    async def create_conversation(
        self,
        text: str,
        *,
        persona: str = "default",
        tools: Sequence[Tool] | None = None,
        instructions: str | None = None,
        model: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> TurnOut:
        """Start a conversation and wait for its first turn."""
        body = _create_body(
            text, persona=persona, tools=tools, instructions=instructions, model=model, metadata=metadata
        )
        turn: TurnOut = await self._call(
            conversations_create.asyncio_detailed, body=body, idempotency_key=idempotency_key or UNSET
        )
        return turn

    def stream_conversation(
        self,
        text: str,
        *,
        persona: str = "default",
        tools: Sequence[Tool] | None = None,
        instructions: str | None = None,
        model: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncTurnStream:
        """Start a conversation; its first turn's events as they happen."""
        body = _create_body(
            text,
            persona=persona,
            tools=tools,
            instructions=instructions,
            model=model,
            metadata=metadata,
            stream=True,
        )
        return self._stream(
            "POST", "/v1/conversations", body.to_dict(), _key_headers(idempotency_key=idempotency_key)
        )

    async def send_message(
        self,
        conversation_id: str,
        text: str,
        *,
        tools: Sequence[Tool] | None = None,
        if_match: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> TurnOut:
        """Send the next message and wait for the turn."""
        turn: TurnOut = await self._call(
            conversations_messages_create.asyncio_detailed,
            conversation_id,
            body=PostMessage(input_=text, tools=_tools(tools)),
            if_match=_if_match(if_match),
            idempotency_key=idempotency_key or UNSET,
        )
        return turn

    def stream_message(
        self,
        conversation_id: str,
        text: str,
        *,
        tools: Sequence[Tool] | None = None,
        if_match: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncTurnStream:
        """Send the next message; the turn's events as they happen."""
        body = PostMessage(input_=text, tools=_tools(tools), stream=True).to_dict()
        headers = _key_headers(idempotency_key=idempotency_key, if_match=if_match)
        return self._stream("POST", f"/v1/conversations/{conversation_id}/messages", body, headers)

    async def submit_tool_results(
        self,
        conversation_id: str,
        results: Results,
        *,
        if_match: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> TurnOut:
        """Answer the pending tool calls and wait for the resumed turn."""
        turn: TurnOut = await self._call(
            conversations_tool_results_create.asyncio_detailed,
            conversation_id,
            body=_results(results),
            if_match=_if_match(if_match),
            idempotency_key=idempotency_key or UNSET,
        )
        return turn

    def stream_tool_results(
        self,
        conversation_id: str,
        results: Results,
        *,
        if_match: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncTurnStream:
        """Answer the pending tool calls; the resumed turn's events as they happen."""
        body = _results(results)
        body.stream = True
        headers = _key_headers(idempotency_key=idempotency_key, if_match=if_match)
        return self._stream(
            "POST", f"/v1/conversations/{conversation_id}/tool-results", body.to_dict(), headers
        )

    def follow(self, conversation_id: str, *, last_event_id: str | None = None) -> AsyncTurnStream:
        """The conversation's events after ``last_event_id``, then the running turn's, live."""
        headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
        return self._stream("GET", f"/v1/conversations/{conversation_id}/events", None, headers)

    async def get_conversation(self, conversation_id: str) -> ConversationOut:
        """The conversation's state: status, version, pending tool calls, usage."""
        conversation: ConversationOut = await self._call(conversations_get.asyncio_detailed, conversation_id)
        return conversation

    async def messages(self, conversation_id: str, *, page_size: int = 100) -> AsyncIterator[MessageOut]:
        """The whole transcript, oldest first (fetched page by page)."""
        after = -1
        while True:
            page = await self._call(
                conversations_messages_list.asyncio_detailed, conversation_id, after=after, limit=page_size
            )
            for message in page.data:
                yield message
            if not page.has_more or page.next_after is None:
                return
            after = page.next_after

    async def cancel_turn(self, conversation_id: str, turn_id: str, *, wait: float = 10) -> TurnOut:
        """Stop a queued or running turn."""
        turn: TurnOut = await self._call(
            conversations_turns_cancel.asyncio_detailed, conversation_id, turn_id, wait=wait
        )
        return turn

    async def delete_conversation(self, conversation_id: str) -> None:
        """Delete the conversation and everything it owns."""
        await self._call(conversations_delete.asyncio_detailed, conversation_id)

    async def file(self, file_id: str) -> bytes:
        """The bytes of a file a turn produced (a PNG figure)."""
        found: File = await self._call(files_get.asyncio_detailed, file_id)
        return found.payload.read()
