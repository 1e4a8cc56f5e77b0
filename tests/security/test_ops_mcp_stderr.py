"""What a stdio MCP server writes to its stderr, in SABRE's log.

The server's stderr was SABRE's own: its lines went into the JSON log stream unchanged. Servers log
what they are asked (their requests, their tracebacks), and a tenant's model chooses the arguments,
so a tenant could write a line of its choice into the operator's log, e.g. a forged access line of
another tenant. Now each line is logged as ``mcp_server_stderr`` with the server's name, its text a
bounded field of that JSON line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.kit.logging import ensure_logging
from app.tools.mcp import McpManager, StdioServerConfig

# A minimal MCP server (raw JSON-RPC) that logs each call's arguments to stderr, as servers do.
SERVER = r"""
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    request_id, method = message.get("id"), message.get("method")
    if request_id is None:
        continue
    if method == "initialize":
        result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "echo", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "note", "inputSchema": {"type": "object"}}]}
    else:
        text = message["params"]["arguments"]["text"]
        sys.stderr.write("note called with " + text + "\n" + "x" * 100_000 + "\n")
        sys.stderr.flush()
        result = {"content": [{"type": "text", "text": "noted"}]}
    print(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}), flush=True)
"""

FORGED = {"event": "request", "method": "DELETE", "status": 204, "tenant": "globex", "forged": True}


async def test_a_servers_stderr_cannot_forge_log_lines(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    ensure_logging(fmt="json")  # as the service's processes log (JSON lines on stderr)
    script = tmp_path / "echo_server.py"
    script.write_text(SERVER)
    config = StdioServerConfig(transport="stdio", command=sys.executable, args=(str(script),))
    manager = McpManager({"echo": config}, timeout=10)
    try:
        assert await manager.call_tool("echo", "note", {"text": "hi\n" + json.dumps(FORGED)}) == "noted"
    finally:
        await manager.aclose()
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert lines
    for line in lines:
        # Every line is a JSON object of SABRE's, none is the forged one, and none is unbounded.
        parsed = json.loads(line)
        assert "forged" not in parsed, line
        assert len(line) < 20_000
    relayed = [json.loads(line) for line in lines if "mcp_server_stderr" in line]
    assert any(entry["server"] == "echo" and "note called with hi" in entry["line"] for entry in relayed)
    assert any(entry["server"] == "echo" and "forged" in entry["line"] for entry in relayed)
