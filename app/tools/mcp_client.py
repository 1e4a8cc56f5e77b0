"""The MCP SDK side of app/tools/mcp.py: one session per server, and what its results mean to the model.

Kept apart because the ``mcp`` SDK takes over a second to import: the service imports this module at
start-up only when MCP servers are configured, never on a request and never when there are none.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import httpx
import httpx2
import mcp.types as mcp_types
import structlog
from mcp import ClientSession, StdioServerParameters
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

from app.helpers import HelperError
from app.helpers.net import ACCEPT_ENCODING, BoundedDecoder, FetchError, FetchLimits
from app.tools.mcp import HttpServerConfig, StdioServerConfig
from app.tools.mcp_stdio import MAX_LINE_BYTES, LineTooLong, stdio_client

log = structlog.get_logger(__name__)

T = TypeVar("T")

# The SDK bounds a stdio server's shutdown (flush, terminate, kill) by a few seconds; this is the backstop.
_CLOSE_TIMEOUT = 10.0
# Extra time the outer guard gives the SDK's own per-request timeout to fire first (it cancels cleanly).
_TIMEOUT_GRACE = 5.0


class SessionGone(Exception):
    """The server no longer knows our session (an HTTP server restarted): the request was not run, and
    can be sent again on a new session."""


class AnswerRefused(httpx2.StreamError):
    """An HTTP server's answer was too large (or encoded so that it cannot be bounded). A ``StreamError``:
    the SDK then fails that one request with this message, and the session goes on."""


class _BoundedBody(httpx2.AsyncByteStream):
    """The body of one answer that is not an event stream (a JSON-RPC message), decoded by the bounded
    decoder of app/helpers/net.py: at most ``MAX_LINE_BYTES``, the limit of one message over stdio too,
    however far a compressed body would expand. Without it the SDK read the whole body (``aread``)."""

    def __init__(self, response: httpx2.Response) -> None:
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        self._stream = response.stream
        self._decoder = BoundedDecoder(
            httpx.URL(str(response.request.url)),
            response.headers.get("content-encoding", ""),
            FetchLimits(max_bytes=MAX_LINE_BYTES),
        )

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for raw in self._stream:
                yield self._decoder.decode(raw)
            yield self._decoder.flush()
        except FetchError as exc:
            raise AnswerRefused(str(exc)) from None

    async def aclose(self) -> None:
        await self._stream.aclose()


class _WatchedDispatcher(JSONRPCDispatcher[Any]):
    """The SDK's JSON-RPC dispatcher, telling us when its receive loop ends, and why.

    The loop ends when the connection does (the stdio server exited, the HTTP transport failed): the
    session is then dead, and the next call must reconnect rather than fail with "Connection closed".
    When our stdio transport ends a session itself (``LineTooLong``), it puts the reason on the read
    stream just before the end; the dispatcher hands it to ``on_fault`` before it wakes any request with
    "Connection closed", so the requests can tell their callers why.
    """

    def __init__(
        self,
        read_stream: Any,
        write_stream: Any,
        *,
        on_end: Callable[[], None],
        on_fault: Callable[[Exception], None],
    ) -> None:
        super().__init__(read_stream, write_stream)
        self._on_end = on_end
        self._on_fault = on_fault
        # Set here, so ClientSession keeps its own observer off (it would forward the exceptions to a
        # message handler we do not have, in a task of their own: too late for the waiting requests).
        self.on_stream_exception = self._observe

    async def _observe(self, exc: Exception) -> None:
        # Other exceptions (a line that is not JSON-RPC) cost that line only; the transport logged them.
        if isinstance(exc, LineTooLong):
            self._on_fault(exc)

    async def run(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().run(*args, **kwargs)
        finally:
            self._on_end()


class McpConnection:
    """One initialised session with one server, opened and closed by a task of its own.

    The SDK's transports and sessions are anyio task groups and cancel scopes, which must be exited by
    the task that entered them; calls, though, come from many request tasks. So a long-lived owner task
    enters the contexts, hands the session out, and exits them when asked to close or when the
    connection ends; callers use the session concurrently from their own tasks.
    """

    def __init__(self, *, name: str, config: StdioServerConfig | HttpServerConfig, timeout: float) -> None:
        self.name = name
        self._config = config
        self._timeout = timeout
        self._closing = asyncio.Event()
        self._ended = False
        self._task: asyncio.Task[None] | None = None
        self._session: ClientSession | None = None
        # Set when an HTTP server answered 404 to our session id: it no longer knows the session.
        self.session_expired = False
        # Why the transport ended the session, when it did so itself (a stdio server's line too long).
        self.fault: Exception | None = None

    @property
    def alive(self) -> bool:
        """Whether the session can still carry calls."""
        return self._session is not None and not self._ended and not self._closing.is_set()

    @property
    def session(self) -> ClientSession:
        """The initialised session (only after ``open``)."""
        assert self._session is not None
        return self._session

    async def open(self) -> None:
        """Start the owner task and wait until the session is initialised; ``HelperError`` if it fails."""
        ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._own(ready), name=f"mcp-session:{self.name}")
        try:
            async with asyncio.timeout(self._timeout):
                self._session = await ready
        except BaseException as exc:
            # The owner may still be starting (a handshake nobody answers): stop it now, not after a grace.
            self._closing.set()
            self._task.cancel()
            await asyncio.wait({self._task})
            if isinstance(exc, TimeoutError):
                raise HelperError(self._too_slow_to_start()) from None
            raise
        log.info("mcp_connected", server=self.name, transport=self._config.transport)

    async def close(self) -> None:
        """Ask the owner task to close the session and wait for it (bounded: shutdown must not hang)."""
        self._closing.set()
        task = self._task
        if task is None or task is asyncio.current_task():
            return
        done, _ = await asyncio.wait({task}, timeout=_CLOSE_TIMEOUT)
        if not done:
            task.cancel()
            await asyncio.wait({task})

    def mark_ended(self) -> None:
        """The connection is known to be gone: the next call opens a new one, and the owner task closes
        this one (the dispatcher's loop may notice the end a moment after the callers do)."""
        self._ended = True
        self._closing.set()

    async def _own(self, ready: asyncio.Future[ClientSession]) -> None:
        """The owner task: open the transport and session, serve until closed, close in this same task."""
        try:
            async with AsyncExitStack() as stack:
                read_stream, write_stream = await stack.enter_async_context(self._transport())
                dispatcher = _WatchedDispatcher(
                    read_stream, write_stream, on_end=self.mark_ended, on_fault=self._fault
                )
                session = await stack.enter_async_context(
                    ClientSession(dispatcher=dispatcher, read_timeout_seconds=self._timeout)
                )
                await session.initialize()
                if not ready.done():
                    ready.set_result(session)
                await self._closing.wait()
        except Exception as exc:
            if not ready.done():
                timed_out = isinstance(exc, MCPError) and exc.code == mcp_types.REQUEST_TIMEOUT
                message = (
                    self._too_slow_to_start()
                    if timed_out
                    else f"MCP server {self.name!r} is unreachable: {self.fault or describe(exc)}"
                )
                ready.set_exception(HelperError(message))
            elif not self._closing.is_set() or self._ended:
                log.warning("mcp_session_failed", server=self.name, error=describe(exc))
        finally:
            self._ended = True
            if not ready.done():
                ready.set_exception(HelperError(f"MCP server {self.name!r}: the connection was closed"))
            if self._session is not None:
                log.info("mcp_disconnected", server=self.name)

    def _fault(self, exc: Exception) -> None:
        self.fault = exc
        log.warning("mcp_session_ended_by_transport", server=self.name, reason=str(exc))
        self.mark_ended()

    def _too_slow_to_start(self) -> str:
        return f"MCP server {self.name!r} did not complete its start within {self._timeout:g} s"

    def _transport(self) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        """The transport for this server's configuration (entered by the owner task)."""
        config = self._config
        if isinstance(config, StdioServerConfig):
            # Our transport (app/tools/mcp_stdio.py), not the SDK's: it bounds a line, and splits lines in
            # linear time. "replace": with "strict", a line holding a byte that is not UTF-8 would be lost
            # (with the SDK's reader, the reader itself died), and its call would time out.
            params = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=dict(config.env),
                cwd=config.cwd,
                encoding_error_handler="replace",
            )
            return stdio_client(params, name=self.name)
        return _http_transport(config, request_seconds=self._timeout, on_session_expired=self._expire)

    def _expire(self) -> None:
        self.session_expired = True
        self.mark_ended()


@asynccontextmanager
async def _http_transport(
    config: HttpServerConfig, *, request_seconds: float, on_session_expired: Callable[[], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """Streamable HTTP with the configured headers; the HTTP client lives exactly as long as the session."""

    async def watch(response: httpx2.Response) -> None:
        # The MCP spec: a server answers 404 to a session id it no longer knows (it restarted, or expired
        # the session), and the client starts a new session. The SDK reports only the JSON-RPC error,
        # whose code and text differ between servers, so the status is read here.
        if response.status_code == 404 and MCP_SESSION_ID in response.request.headers:
            on_session_expired()
        # One message at most MAX_LINE_BYTES, as over stdio: a JSON body here (decoded here, so httpx2
        # must not decode it again), an SSE event by the SDK (max_sse_event_size below).
        if not response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            response.stream = _BoundedBody(response)
            response.headers.pop("content-encoding", None)

    # The read timeout stays long: the server may hold a response stream open between events.
    http_timeout = httpx2.Timeout(request_seconds, read=max(request_seconds, 300.0))
    async with (
        httpx2.AsyncClient(
            headers={**config.headers, "accept-encoding": ACCEPT_ENCODING},  # what BoundedDecoder reads
            timeout=http_timeout,
            event_hooks={"response": [watch]},
        ) as client,
        streamable_http_client(config.url, http_client=client, max_sse_event_size=MAX_LINE_BYTES) as (
            read_stream,
            write_stream,
        ),
    ):
        yield read_stream, write_stream


async def list_all_tools(connection: McpConnection, *, seconds: float) -> dict[str, mcp_types.Tool]:
    """Every tool of the server by name, page after page."""
    tools: dict[str, mcp_types.Tool] = {}
    cursor: str | None = None
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await request(
            connection, "tools/list", connection.session.list_tools(params=params), seconds=seconds
        )
        tools.update((tool.name, tool) for tool in page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


async def call_tool(
    connection: McpConnection,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    listing: Mapping[str, mcp_types.Tool],
    seconds: float,
) -> Any:
    """Call ``tool`` and return what the model's code gets back (``HelperError`` on any failure)."""
    result = await request(
        connection,
        f"tools/call {tool}",
        connection.session.call_tool(tool, dict(arguments), read_timeout_seconds=seconds),
        seconds=seconds,
    )
    return tool_value(result, server=connection.name, tool=tool, listing=listing)


async def request(connection: McpConnection, what: str, pending: Awaitable[T], *, seconds: float) -> T:
    """Await one request on ``connection``, turning every failure into a message for the model."""
    name = connection.name
    too_slow = f"MCP server {name!r} did not answer {what} within {seconds:g} s"
    try:
        # The SDK's own per-request timeout fires first and cancels cleanly; this is the backstop.
        async with asyncio.timeout(seconds + _TIMEOUT_GRACE):
            return await pending
    except TimeoutError:
        raise HelperError(too_slow) from None
    except MCPError as exc:
        if connection.session_expired:
            raise SessionGone() from exc
        if exc.code == mcp_types.REQUEST_TIMEOUT:
            raise HelperError(too_slow) from None
        if exc.code == mcp_types.CONNECTION_CLOSED:
            connection.mark_ended()
            if connection.fault is not None:
                raise HelperError(
                    f"MCP server {name!r} failed {what}: {connection.fault}; the next call restarts it"
                ) from None
            why = exc.message.rstrip(".")
            raise HelperError(
                f"MCP server {name!r} closed the connection during {what} ({why}; the call may or may not "
                "have run); the next call reconnects"
            ) from None
        if exc.code == mcp_types.PARSE_ERROR:
            raise HelperError(
                f"MCP server {name!r} answered {what} with what cannot be used: {exc.message}"
            ) from None
        raise HelperError(f"MCP server {name!r} refused {what}: {exc.message}") from None
    except Exception as exc:
        raise HelperError(f"MCP server {name!r} failed {what}: {describe(exc)}") from None


def tool_value(
    result: mcp_types.CallToolResult, *, server: str, tool: str, listing: Mapping[str, mcp_types.Tool]
) -> Any:
    """What the model's code gets back from a tool result (or the ``HelperError`` it raises)."""
    if result.is_error:
        message = content_text(result.content) or f"the MCP tool {server}/{tool} failed without a message"
        if tool not in listing:
            offered = ", ".join(sorted(listing)) or "no tools"
            message += f" (MCP server {server!r} offers: {offered})"
        raise HelperError(message)
    value = result.structured_content
    if value is None:
        return content_text(result.content)
    declared = listing.get(tool)
    # Servers built with the SDK wrap a plain return value as {"result": value} under a synthesised output
    # schema with that one property; the model called add(2, 3) and expects 5, not {"result": 5}.
    schema = declared.output_schema if declared is not None else None
    if schema is not None and set(schema.get("properties", {})) == {"result"} and set(value) == {"result"}:
        return value["result"]
    return value


def content_text(blocks: Iterable[mcp_types.ContentBlock]) -> str:
    """Content blocks as one text: texts as they are, binary content as a short placeholder."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent):
            parts.append(f"[image: {block.mime_type}, not shown]")
        elif isinstance(block, mcp_types.AudioContent):
            parts.append(f"[audio: {block.mime_type}, not shown]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource: {block.uri}]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(resource.text)
            else:
                parts.append(f"[resource: {resource.uri} ({resource.mime_type or 'binary'}), not shown]")
        else:
            parts.append(f"[{getattr(block, 'type', 'content')}: not shown]")
    return "\n".join(parts)


def describe(exc: BaseException) -> str:
    """A one-line account of ``exc``; task-group exception groups are unwrapped to their first cause."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
