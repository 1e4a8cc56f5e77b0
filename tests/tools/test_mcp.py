"""MCP tools: the manager against a real MCP server (tests/tools/mcp_server.py) over stdio and streamable
HTTP, the configuration file, and persona tools called by the model's code end to end."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import mcp.types as mcp_types
import pytest

from app.helpers import HelperError
from app.llm.scripted import ScriptedLLM
from app.main import StartupError
from app.tools.mcp import (
    HttpServerConfig,
    McpConfigError,
    McpManager,
    StdioServerConfig,
    load_mcp_servers,
)
from app.tools.mcp_client import content_text
from app.tools.mcp_stdio import MAX_LINE_BYTES
from tests.conftest import AppFactory

SERVER_SCRIPT = Path(__file__).with_name("mcp_server.py")
TRANSPORTS = ["stdio", "http"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stdio_config() -> StdioServerConfig:
    return StdioServerConfig(transport="stdio", command=sys.executable, args=(str(SERVER_SCRIPT),))


def start_http_server(port: int, *, json: bool = False) -> subprocess.Popen[bytes]:
    """The test server over streamable HTTP on loopback (answers as JSON bodies with ``json``), once it
    accepts connections."""
    command = [sys.executable, str(SERVER_SCRIPT), "--http", str(port), *(["--json"] if json else [])]
    process = subprocess.Popen(command)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the MCP test server exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the MCP test server did not start listening within 30 s")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def mcp_http_url() -> Iterator[str]:
    """One streamable-HTTP test server for the session (its tools are stateless)."""
    port = free_port()
    process = start_http_server(port)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


@pytest.fixture(scope="session")
def mcp_http_json_url() -> Iterator[str]:
    """The streamable-HTTP test server answering each request with one JSON body instead of SSE."""
    port = free_port()
    process = start_http_server(port, json=True)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


def server_config(transport: str, request: pytest.FixtureRequest) -> StdioServerConfig | HttpServerConfig:
    if transport == "stdio":
        return stdio_config()
    return HttpServerConfig(transport="http", url=request.getfixturevalue("mcp_http_url"))


@pytest.fixture(params=TRANSPORTS)
async def manager(request: pytest.FixtureRequest) -> AsyncIterator[McpManager]:
    """A manager with the test server as ``math``, over each transport."""
    manager = McpManager({"math": server_config(request.param, request)}, timeout=10)
    try:
        yield manager
    finally:
        await manager.aclose()


# -- the manager -------------------------------------------------------------------------------------


async def test_calls_return_the_tools_values(manager: McpManager) -> None:
    # A plain return value arrives as itself, not as the SDK's {"result": ...} wrapper.
    assert await manager.call_tool("math", "add", {"a": 2, "b": 3}) == 5
    assert await manager.call_tool("math", "echo", {"text": "héllo"}) == "héllo"
    # Structured content that is not a wrapper is returned as it is.
    assert await manager.call_tool("math", "summarise", {"values": [3, 1, 2]}) == {"min": 1, "max": 3}


async def test_tools_are_listed(manager: McpManager) -> None:
    tools = {tool.name: tool for tool in await manager.list_tools("math")}
    assert {"add", "echo", "fail", "slow"} <= set(tools)
    assert tools["add"].input_schema["required"] == ["a", "b"]


async def test_a_tool_error_carries_the_servers_message(manager: McpManager) -> None:
    with pytest.raises(HelperError, match="refused: not today"):
        await manager.call_tool("math", "fail", {"reason": "not today"})
    # The session survives a tool's error.
    assert await manager.call_tool("math", "add", {"a": 1, "b": 1}) == 2


async def test_an_unknown_tool_carries_the_servers_message(manager: McpManager) -> None:
    with pytest.raises(HelperError) as caught:
        await manager.call_tool("math", "multiply", {"a": 2, "b": 3})
    assert "Unknown tool: multiply" in str(caught.value)
    assert "MCP server 'math' offers: add, big, count, crash, echo, fail, pid, slow, summarise" in str(
        caught.value
    )


async def test_bad_arguments_carry_the_servers_message(manager: McpManager) -> None:
    with pytest.raises(HelperError, match="validation error"):
        await manager.call_tool("math", "add", {"a": "two"})


async def test_concurrent_calls_share_one_session(manager: McpManager) -> None:
    results = await asyncio.gather(*(manager.call_tool("math", "add", {"a": i, "b": i}) for i in range(20)))
    assert results == [2 * i for i in range(20)]
    pids = await asyncio.gather(*(manager.call_tool("math", "pid", {}) for _ in range(5)))
    assert len(set(pids)) == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_slow_tool_times_out(transport: str, request: pytest.FixtureRequest) -> None:
    # 6 s: a stdio server's start (a Python process) must fit in it on a busy test machine too.
    manager = McpManager({"math": server_config(transport, request)}, timeout=6)
    try:
        await manager.call_tool("math", "add", {"a": 1, "b": 2})
        started = time.monotonic()
        with pytest.raises(HelperError, match=r"MCP server 'math' did not answer tools/call slow within 6 s"):
            await manager.call_tool("math", "slow", {"seconds": 30})
        assert time.monotonic() - started < 12
        # The session is still usable after a call timed out.
        assert await manager.call_tool("math", "add", {"a": 1, "b": 2}) == 3
    finally:
        await manager.aclose()


async def test_a_dead_stdio_server_is_restarted_on_the_next_call() -> None:
    manager = McpManager({"math": stdio_config()}, timeout=10)
    try:
        first = await manager.call_tool("math", "pid", {})
        # A call in flight when the server dies is reported, not repeated (it may have run).
        with pytest.raises(HelperError, match="closed the connection during tools/call crash"):
            await manager.call_tool("math", "crash", {})
        assert await manager.call_tool("math", "add", {"a": 2, "b": 2}) == 4
        assert await manager.call_tool("math", "pid", {}) != first
    finally:
        await manager.aclose()


async def test_a_restarted_http_server_is_reconnected() -> None:
    port = free_port()
    process = start_http_server(port)
    manager = McpManager({"math": HttpServerConfig(transport="http", url=f"http://127.0.0.1:{port}/mcp")})
    try:
        first = await manager.call_tool("math", "pid", {})
        stop(process)
        process = start_http_server(port)
        # The new server does not know the old session; the call is sent again on a new one.
        assert await manager.call_tool("math", "pid", {}) == process.pid != first
    finally:
        await manager.aclose()
        stop(process)


async def test_aclose_stops_the_stdio_server() -> None:
    manager = McpManager({"math": stdio_config()}, timeout=10)
    pid = await manager.call_tool("math", "pid", {})
    await manager.aclose()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # A closed manager reconnects if it is used again.
    assert await manager.call_tool("math", "add", {"a": 1, "b": 1}) == 2
    await manager.aclose()


@pytest.mark.parametrize("answers", ["json", "sse"])
async def test_one_http_answer_is_capped_as_one_stdio_line_is(
    answers: str, request: pytest.FixtureRequest
) -> None:
    # Before: a JSON answer was read whole however large (the SDK caps SSE events only, at 1 MiB), so a
    # tenant's server could fill the service's memory; now either kind holds at most MAX_LINE_BYTES.
    url = request.getfixturevalue("mcp_http_json_url" if answers == "json" else "mcp_http_url")
    manager = McpManager({"math": HttpServerConfig(transport="http", url=url)}, timeout=60)
    try:
        # Under the cap (a str result is sent twice: 4 MiB), whole over either kind of answer.
        size = 2 * 1024 * 1024
        assert await manager.call_tool("math", "big", {"size": size}) == "x" * size
        # The JSON body in net.py's words, the SSE event in the SDK's.
        cap = MAX_LINE_BYTES
        over = rf"MCP server 'math'.*(limit of {cap:,} bytes per response|{cap} byte limit)"
        with pytest.raises(HelperError, match=over):
            await manager.call_tool("math", "big", {"size": MAX_LINE_BYTES + 1})
        assert await manager.call_tool("math", "add", {"a": 2, "b": 3}) == 5
    finally:
        await manager.aclose()


async def test_an_unreachable_http_server() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    manager = McpManager({"down": HttpServerConfig(transport="http", url=url)}, timeout=5)
    with pytest.raises(HelperError, match=r"MCP server 'down' is unreachable: ConnectError"):
        await manager.call_tool("down", "add", {"a": 1, "b": 2})
    await manager.aclose()


async def test_a_stdio_server_that_cannot_start() -> None:
    config = StdioServerConfig(transport="stdio", command="/nonexistent/mcp-server")
    manager = McpManager({"gone": config}, timeout=5)
    with pytest.raises(HelperError, match=r"MCP server 'gone' is unreachable: FileNotFoundError"):
        await manager.call_tool("gone", "add", {"a": 1, "b": 2})
    await manager.aclose()


async def test_a_stdio_server_that_never_answers() -> None:
    # `sleep` reads nothing and writes nothing: the handshake times out and the process is stopped.
    config = StdioServerConfig(transport="stdio", command="sleep", args=("30",))
    manager = McpManager({"mute": config}, timeout=1)
    started = time.monotonic()
    with pytest.raises(HelperError, match=r"MCP server 'mute' did not complete its start within 1 s"):
        await manager.call_tool("mute", "add", {})
    assert time.monotonic() - started < 10
    await manager.aclose()


async def test_an_unknown_server() -> None:
    manager = McpManager({"math": stdio_config()})
    with pytest.raises(HelperError, match=r"no MCP server 'maths' is configured \(configured: math\)"):
        await manager.call_tool("maths", "add", {})


def test_content_blocks_become_text() -> None:
    blocks: list[mcp_types.ContentBlock] = [
        mcp_types.TextContent(type="text", text="a chart:"),
        mcp_types.ImageContent(type="image", data="aGk=", mime_type="image/png"),
        mcp_types.EmbeddedResource(
            type="resource",
            resource=mcp_types.TextResourceContents(uri="file:///notes.txt", text="the notes"),
        ),
    ]
    assert content_text(blocks) == "a chart:\n[image: image/png, not shown]\nthe notes"


# -- the configuration file ----------------------------------------------------------------------------


def test_a_missing_default_file_means_no_servers(tmp_path: Path) -> None:
    assert load_mcp_servers(tmp_path / "mcp_servers.yaml", required=False) == {}


def test_a_missing_configured_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(McpConfigError, match=f"{path}: SABRE_MCP_SERVERS names no readable file"):
        load_mcp_servers(path, required=True)


def test_servers_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELPDESK_TOKEN", "t0ken")
    path = tmp_path / "mcp_servers.yaml"
    path.write_text(
        "servers:\n"
        "  math:\n"
        "    transport: stdio\n"
        "    command: python\n"
        "    args: [server.py]\n"
        "    env: {LEVEL: debug}\n"
        "    cwd: tools\n"
        "  helpdesk:\n"
        "    transport: http\n"
        "    url: https://helpdesk.example/mcp\n"
        "    headers: {Authorization: 'Bearer ${HELPDESK_TOKEN}'}\n"
    )
    servers = load_mcp_servers(path, required=True)
    math, helpdesk = servers["math"], servers["helpdesk"]
    assert isinstance(math, StdioServerConfig)
    assert (math.command, math.args, math.env, math.cwd) == (
        "python",
        ("server.py",),
        {"LEVEL": "debug"},
        tmp_path / "tools",
    )
    assert isinstance(helpdesk, HttpServerConfig)
    assert helpdesk.headers == {"Authorization": "Bearer t0ken"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("servers: {math: {transport: stdio}}", "servers.math.stdio.command: Field required"),
        ("servers: {math: {transport: pipe, command: x}}", "servers.math: Input tag 'pipe'"),
        ("servers: {math: {transport: http, url: ftp://x}}", "'ftp://x' is not an http:// or https:// URL"),
        ("servers: {math: {transport: http, url: 'http://x', header: {}}}", "header: Extra inputs"),
        ("server: {}", "server: Extra inputs are not permitted"),
        ("servers: {'my server': {transport: stdio, command: x}}", "server name 'my server'"),
        ("servers: [", "cannot read it as YAML"),
        (
            "servers: {h: {transport: http, url: 'http://x', headers: {A: '${SABRE_TEST_UNSET_VARIABLE}'}}}",
            "servers.h.headers: the environment variable SABRE_TEST_UNSET_VARIABLE is not set",
        ),
    ],
)
def test_an_invalid_file_names_the_file_and_the_problem(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "mcp_servers.yaml"
    path.write_text(text)
    with pytest.raises(McpConfigError) as caught:
        load_mcp_servers(path, required=False)
    assert str(caught.value).startswith(f"{path}: ")
    assert problem in str(caught.value)


# -- end to end: a persona's MCP tools called by the model's code ----------------------------------------

CALC_PERSONA = """\
description: Adds numbers with an MCP server.
identity: You are a calculator. You add numbers with the add tool.
featured_helpers: [result]
custom_tools:
  - name: add
    description: Add two integers.
    parameters:
      type: object
      properties:
        a: {type: integer}
        b: {type: integer}
      required: [a, b]
    execution_mode: internal
    implementation: mcp://math/add
  - name: counter
    description: Count the calls.
    execution_mode: internal
    implementation: mcp://math/count
  - name: refuse
    description: Always refuses.
    parameters:
      type: object
      properties:
        reason: {type: string}
      required: [reason]
    execution_mode: internal
    implementation: mcp://math/fail
  - name: huge
    description: An answer of `size` characters.
    parameters:
      type: object
      properties:
        size: {type: integer}
      required: [size]
    execution_mode: internal
    implementation: mcp://math/big
"""


def write_config(
    tmp_path: Path, *, transport: str, request: pytest.FixtureRequest | None
) -> tuple[Path, Path]:
    """A personas directory with the ``calc`` persona and an mcp_servers.yaml with ``math``."""
    personas = tmp_path / "personas"
    personas.mkdir()
    (personas / "calc.yaml").write_text(CALC_PERSONA)
    servers = tmp_path / "mcp_servers.yaml"
    if transport == "stdio":
        servers.write_text(
            "servers:\n"
            "  math:\n"
            "    transport: stdio\n"
            f"    command: {sys.executable}\n"
            f"    args: [{SERVER_SCRIPT}]\n"
        )
    else:
        assert request is not None
        url = request.getfixturevalue("mcp_http_url")
        servers.write_text(f"servers:\n  math:\n    transport: http\n    url: {url}\n")
    return personas, servers


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_model_calls_an_mcp_tool(
    make_client: AppFactory,
    llm: ScriptedLLM,
    tmp_path: Path,
    transport: str,
    request: pytest.FixtureRequest,
) -> None:
    personas, servers = write_config(tmp_path, transport=transport, request=request)
    llm.script("<helpers>\nprint(add(2, 3))\nresult(add(a=40, b=2))\n</helpers>", "ok")
    async with make_client(personas_dir=personas, mcp_servers=servers) as client:
        response = await client.post("/v1/conversations", json={"persona": "calc", "input": "2 + 3?"})
    assert response.status_code == 201, response.text
    turn = response.json()
    assert (turn["status"], turn["output"]) == ("completed", "ok")
    assert "### add(*, a: int, b: int)" in llm.requests[0].all_text  # documented in the prompt
    seen = llm.requests[1].all_text
    assert "<helpers_result>" in seen
    assert "5" in seen.split("<helpers_result>", 1)[1]
    assert "42" in seen.split("<helpers_result>", 1)[1]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_mcp_tool_error_reaches_the_model_as_tool_error(
    make_client: AppFactory,
    llm: ScriptedLLM,
    tmp_path: Path,
    transport: str,
    request: pytest.FixtureRequest,
) -> None:
    personas, servers = write_config(tmp_path, transport=transport, request=request)
    llm.script(
        "<helpers>\ntry:\n    refuse('no reason')\nexcept ToolError as exc:\n    print('caught:', exc)\n"
        "refuse(reason='again')\n</helpers>",
        "sorry",
    )
    async with make_client(personas_dir=personas, mcp_servers=servers) as client:
        response = await client.post("/v1/conversations", json={"persona": "calc", "input": "go"})
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "completed"
    seen = llm.requests[1].all_text
    assert "caught: Error executing tool fail: refused: no reason" in seen
    assert "ToolError: Error executing tool fail: refused: again" in seen


async def test_an_http_answer_over_the_cap_reaches_the_model_as_tool_error(
    make_client: AppFactory, llm: ScriptedLLM, tmp_path: Path, mcp_http_json_url: str
) -> None:
    # A tenant's server answering with one JSON body larger than one message may be: the block catches
    # ToolError and goes on (before: the whole body was read, then the journal's 32 MiB check refused it).
    personas, servers = write_config(tmp_path, transport="stdio", request=None)
    servers.write_text(f"servers:\n  math:\n    transport: http\n    url: {mcp_http_json_url}\n")
    llm.script(
        f"<helpers>\ntry:\n    huge(size={MAX_LINE_BYTES + 1})\nexcept ToolError as exc:\n"
        "    print('caught:', exc)\nprint(add(2, 3))\n</helpers>",
        "too big",
    )
    async with make_client(personas_dir=personas, mcp_servers=servers) as client:
        response = await client.post("/v1/conversations", json={"persona": "calc", "input": "go"})
    assert response.status_code == 201, response.text
    assert (response.json()["status"], response.json()["output"]) == ("completed", "too big")
    seen = llm.requests[1].all_text.split("<helpers_result>", 1)[1]
    assert "caught: MCP server 'math' answered tools/call big with what cannot be used" in seen
    assert f"larger than the limit of {MAX_LINE_BYTES:,} bytes per response" in seen
    assert "5" in seen


async def test_a_resumed_block_replays_mcp_results_instead_of_calling_again(
    make_client: AppFactory, llm: ScriptedLLM, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # stdio: each app starts its own server process, so the call counter starts at zero.
    personas, servers = write_config(tmp_path, transport="stdio", request=request)
    confirm = {
        "type": "function",
        "name": "confirm",
        "description": "Ask the caller to confirm a number.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    }
    llm.script(
        "<helpers>\nn = counter()\nanswer = confirm(n=n)\nprint('count', n, answer)\n</helpers>", "done"
    )
    async with make_client(personas_dir=personas, mcp_servers=servers) as client:
        response = await client.post(
            "/v1/conversations", json={"persona": "calc", "input": "count", "tools": [confirm]}
        )
        assert response.status_code == 201, response.text
        turn = response.json()
        [call] = turn["pending_tool_calls"]
        assert call["arguments"] == {"n": 1}
        response = await client.post(
            f"/v1/conversations/{turn['conversation_id']}/tool-results",
            json={"results": [{"tool_call_id": call["id"], "output": "yes"}]},
        )
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "completed"
        # The block ran twice, but the server saw one call: the second run replayed its result.
        assert "count 1 yes" in llm.requests[1].all_text
        assert await client.app.state.mcp.call_tool("math", "count", {}) == 2  # type: ignore[attr-defined]


async def test_a_persona_naming_an_unconfigured_server_stops_the_service(
    make_client: AppFactory, tmp_path: Path
) -> None:
    personas = tmp_path / "personas"
    personas.mkdir()
    (personas / "calc.yaml").write_text(CALC_PERSONA)
    servers = tmp_path / "mcp_servers.yaml"
    servers.write_text("servers:\n  algebra: {transport: stdio, command: algebra-mcp}\n")
    with pytest.raises(StartupError) as caught:
        async with make_client(personas_dir=personas, mcp_servers=servers):
            pass
    message = str(caught.value)
    assert "persona 'calc': tool 'add' uses mcp://math/add" in message
    assert "no MCP server 'math' is configured" in message


async def test_an_invalid_server_file_stops_the_service(make_client: AppFactory, tmp_path: Path) -> None:
    servers = tmp_path / "mcp_servers.yaml"
    servers.write_text("servers: {math: {transport: stdio}}\n")
    with pytest.raises(StartupError, match=f"{servers}: servers.math.stdio.command: Field required"):
        async with make_client(mcp_servers=servers):
            pass
    with pytest.raises(StartupError, match="names no readable file"):
        async with make_client(mcp_servers=tmp_path / "missing.yaml"):
            pass
