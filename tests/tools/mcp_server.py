"""A small MCP server for the tests, built with the SDK's MCPServer (v1's FastMCP).

``python mcp_server.py`` serves over stdio; ``python mcp_server.py --http PORT`` serves streamable HTTP on
127.0.0.1:PORT at ``/mcp`` (answering requests with SSE, or with one JSON body each with ``--json``). Both
transports expose the same tools, so the same assertions hold over each.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("sabre-test-math")
calls = {"count": 0}


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def summarise(values: list[float]) -> dict[str, float]:
    """Smallest and largest value: a structured result that is not wrapped as {"result": ...}."""
    return {"min": min(values), "max": max(values)}


@server.tool()
def pid() -> int:
    """This server's process id: lets the tests see one session per server, and its end."""
    return os.getpid()


@server.tool()
def count() -> int:
    """How many times this tool was called in this process: lets the tests see a call replayed, not re-run."""
    calls["count"] += 1
    return calls["count"]


@server.tool()
def fail(reason: str) -> str:
    """Always fail, with the reason as the server's error message."""
    raise ToolError(f"refused: {reason}")


@server.tool()
async def slow(seconds: float) -> str:
    """Answer after ``seconds``: lets the tests exercise the client's timeout."""
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
def big(size: int) -> str:
    """``size`` characters: an answer as large as a test needs (a str result is sent twice: as text and
    as structured content)."""
    return "x" * size


@server.tool()
def crash() -> str:
    """Kill this server process mid-call: lets the tests exercise a dead session."""
    os._exit(3)


def main() -> None:
    """Serve over stdio, or over streamable HTTP with ``--http PORT``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT")
    parser.add_argument("--json", action="store_true", help="over HTTP, answer with JSON bodies, not SSE")
    args = parser.parse_args()
    if args.http is None:
        server.run()
        return
    import uvicorn

    app = server.streamable_http_app(json_response=args.json)
    uvicorn.run(app, host="127.0.0.1", port=args.http, log_level="warning")


if __name__ == "__main__":
    main()
