"""MCP client: persona tools implemented by a tool of an MCP server (``implementation: mcp://server/tool``).

Servers are configured in ``mcp_servers.yaml`` (``SABRE_MCP_SERVERS``) and reached through the official
``mcp`` SDK over stdio (a subprocess) or streamable HTTP. The service connects to a server on the first call
that needs it, keeps one session per server per process, and reports every failure (the tool's own error,
an unknown tool, a server that cannot be reached or does not answer in time) as ``HelperError``, which the
model sees as a ``ToolError`` inside its code. This module holds the configuration and the manager; the
SDK-facing half (sessions, results) is app/tools/mcp_client.py, imported only when servers are configured.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.helpers import HelperError
from app.personas.models import McpRef, Persona
from app.tools.registry import ToolHandler

if TYPE_CHECKING:
    import mcp.types as mcp_types

    from app.tools.mcp_client import McpConnection

# The server part of ``mcp://server/tool`` (app.personas.models): a name no reference could spell is useless.
SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class McpConfigError(Exception):
    """``mcp_servers.yaml`` is missing (when set explicitly) or invalid; the message names file and fault."""


# -- configuration -----------------------------------------------------------------------------------


class _Strict(BaseModel):
    """Unknown keys are errors: a misspelt ``headers`` must not silently send none."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class StdioServerConfig(_Strict):
    """A server the service starts as a subprocess and talks to over its stdin/stdout."""

    transport: Literal["stdio"]
    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    # Added to a minimal safe environment (PATH, HOME, …): the service's own secrets are not inherited.
    env: dict[str, str] = Field(default_factory=dict)
    cwd: Path | None = None


class HttpServerConfig(_Strict):
    """A server reached over streamable HTTP at ``url`` (usually ending in ``/mcp``)."""

    transport: Literal["http"]
    url: str
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url


McpServerConfig = Annotated[StdioServerConfig | HttpServerConfig, Field(discriminator="transport")]


class McpServersFile(_Strict):
    """The whole of ``mcp_servers.yaml``: ``servers: {name: {transport: stdio|http, …}}``."""

    servers: dict[str, McpServerConfig] = Field(default_factory=dict)

    @field_validator("servers")
    @classmethod
    def _names(cls, servers: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in servers:
            if not SERVER_NAME.match(name):
                raise ValueError(
                    f"server name {name!r}: use letters, digits, '_', '.' or '-' (it is written mcp://{name}/tool)"
                )
        return servers


def load_mcp_servers(path: Path, *, required: bool) -> dict[str, McpServerConfig]:
    """The servers of ``path``; none when it does not exist and was not asked for explicitly.

    ``${VAR}`` in ``env`` and ``headers`` values is replaced from the service's environment, so tokens need
    not be written in the file; a relative ``cwd`` is taken from the file's directory.
    """
    if not path.is_file():
        if required or path.exists():
            raise McpConfigError(f"{path}: SABRE_MCP_SERVERS names no readable file")
        return {}
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise McpConfigError(f"{path}: cannot read it as YAML: {exc}") from exc
    if raw is None:
        return {}
    try:
        parsed = McpServersFile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or '(root)'}: {error['msg']}" for error in exc.errors()
        )
        raise McpConfigError(f"{path}: {problems}") from None
    servers: dict[str, McpServerConfig] = {}
    for name, config in parsed.servers.items():
        where = f"{path}: servers.{name}"
        if isinstance(config, StdioServerConfig):
            cwd = config.cwd if config.cwd is None or config.cwd.is_absolute() else path.parent / config.cwd
            servers[name] = config.model_copy(
                update={"env": _expand(config.env, where=f"{where}.env"), "cwd": cwd}
            )
        else:
            servers[name] = config.model_copy(
                update={"headers": _expand(config.headers, where=f"{where}.headers")}
            )
    return servers


def _expand(values: Mapping[str, str], *, where: str) -> dict[str, str]:
    """``values`` with ``${VAR}`` replaced from the environment; an unset variable is an error."""

    def replace(match: re.Match[str]) -> str:
        value = os.environ.get(match[1])
        if value is None:
            raise McpConfigError(f"{where}: the environment variable {match[1]} is not set")
        return value

    return {key: _ENV_REFERENCE.sub(replace, value) for key, value in values.items()}


def unconfigured_references(personas: Iterable[Persona], servers: Iterable[str]) -> list[str]:
    """One message per persona tool whose ``mcp://server/…`` names a server that is not configured."""
    known = set(servers)
    problems = []
    for persona in personas:
        for tool in persona.custom_tools:
            ref = tool.ref
            if isinstance(ref, McpRef) and ref.server not in known:
                problems.append(
                    f"persona {persona.name!r}: tool {tool.name!r} uses mcp://{ref.server}/{ref.tool}, "
                    f"but no MCP server {ref.server!r} is configured in mcp_servers.yaml"
                )
    return problems


# -- the manager -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Server:
    """One configured server: its session (opened under ``lock``) and its tools, listed once per session."""

    name: str
    config: StdioServerConfig | HttpServerConfig
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    connection: McpConnection | None = None
    tools: dict[str, mcp_types.Tool] | None = None


class McpManager:
    """Every configured MCP server of this process, connected on first use; owned by the app lifespan."""

    def __init__(
        self, servers: Mapping[str, StdioServerConfig | HttpServerConfig], *, timeout: float = 60.0
    ) -> None:
        self._servers = {name: _Server(name=name, config=config) for name, config in servers.items()}
        self._timeout = timeout
        if self._servers:
            # The SDK takes over a second to import: pay it now, at start-up, rather than while a
            # request waits, and not at all in a service without MCP servers.
            import app.tools.mcp_client  # noqa: F401

    @classmethod
    def from_file(cls, path: Path, *, required: bool, timeout: float = 60.0) -> McpManager:
        """A manager for the servers of ``path`` (see ``load_mcp_servers``); ``McpConfigError`` if invalid."""
        return cls(load_mcp_servers(path, required=required), timeout=timeout)

    @property
    def server_names(self) -> list[str]:
        """The configured server names, sorted."""
        return sorted(self._servers)

    def handler(self, server: str, tool: str) -> ToolHandler:
        """A registry handler that calls ``tool`` of ``server`` with the call's JSON arguments."""

        async def call(arguments: Mapping[str, Any]) -> Any:
            return await self.call_tool(server, tool, arguments)

        return call

    async def list_tools(self, server: str) -> list[mcp_types.Tool]:
        """The tools ``server`` offers (listed once per session, every page)."""
        from app.tools.mcp_client import SessionGone

        state = self._server(server)
        for attempt in (1, 2):
            connection = await self._connection(state)
            try:
                return list((await self._listing(state, connection)).values())
            except SessionGone:
                await self._discard(state, connection)
                if attempt == 2:
                    raise HelperError(f"MCP server {server!r} keeps dropping its session") from None
        raise AssertionError("unreachable")

    async def call_tool(self, server: str, tool: str, arguments: Mapping[str, Any]) -> Any:
        """Call ``tool`` on ``server``: its structured content when it has some, else its text.

        ``HelperError`` carries the server's message when the tool reports an error, and says what went
        wrong when the server is unknown, unreachable or slower than the timeout. A session the server
        dropped (it restarted) is reopened and the call sent once more: the server had not run it.
        A call in flight when the connection breaks is not repeated, since it may have run.
        """
        from app.tools.mcp_client import SessionGone, call_tool

        state = self._server(server)
        for attempt in (1, 2):
            connection = await self._connection(state)
            try:
                listing = await self._listing(state, connection)
                return await call_tool(connection, tool, arguments, listing=listing, seconds=self._timeout)
            except SessionGone:
                await self._discard(state, connection)
                if attempt == 2:
                    raise HelperError(f"MCP server {server!r} keeps dropping its session") from None
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        """Close every open session (stdio servers are stopped); the manager can reconnect afterwards."""
        for state in self._servers.values():
            async with state.lock:
                if state.connection is not None:
                    await state.connection.close()
                    state.connection = None
                    state.tools = None

    # -- internals ----------------------------------------------------------------------------------

    def _server(self, name: str) -> _Server:
        state = self._servers.get(name)
        if state is None:
            configured = ", ".join(self.server_names) or "none"
            raise HelperError(f"no MCP server {name!r} is configured (configured: {configured})")
        return state

    async def _connection(self, state: _Server) -> McpConnection:
        """The server's live session, opening it (or reopening a dead one) under the server's lock."""
        from app.tools.mcp_client import McpConnection

        async with state.lock:
            connection = state.connection
            if connection is not None and connection.alive:
                return connection
            if connection is not None:
                await connection.close()
                state.connection = None
                state.tools = None
            connection = McpConnection(name=state.name, config=state.config, timeout=self._timeout)
            await connection.open()
            state.connection = connection
            return connection

    async def _discard(self, state: _Server, connection: McpConnection) -> None:
        """Forget ``connection`` if it is still the server's current one (another task may have replaced
        it), and close it."""
        async with state.lock:
            if state.connection is connection:
                state.connection = None
                state.tools = None
        await connection.close()

    async def _listing(self, state: _Server, connection: McpConnection) -> dict[str, mcp_types.Tool]:
        """The server's tools by name, cached until the session changes."""
        from app.tools.mcp_client import list_all_tools

        if state.tools is not None and state.connection is connection:
            return state.tools
        tools = await list_all_tools(connection, seconds=self._timeout)
        if state.connection is connection:
            state.tools = tools
        return tools
