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
from structlog.testing import capture_logs

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
    """The process's own stderr (file descriptor 2, which the server inherited before) gets none of
    the server's lines; SABRE's log (read from structlog's capture: where its stream goes depends on
    which test configured logging first) has them as bounded fields of its own events."""
    script = tmp_path / "echo_server.py"
    script.write_text(SERVER)
    config = StdioServerConfig(transport="stdio", command=sys.executable, args=(str(script),))
    manager = McpManager({"echo": config}, timeout=10)
    with capture_logs() as logs:
        try:
            assert await manager.call_tool("echo", "note", {"text": "hi\n" + json.dumps(FORGED)}) == "noted"
        finally:
            await manager.aclose()
    raw = capfd.readouterr().err
    assert "note called with" not in raw
    assert '"forged": true' not in raw
    relayed = [entry for entry in logs if entry["event"] == "mcp_server_stderr"]
    assert any(entry["server"] == "echo" and "note called with hi" in entry["line"] for entry in relayed)
    assert any(entry["server"] == "echo" and "forged" in entry["line"] for entry in relayed)
    assert all(len(entry["line"]) <= 4096 for entry in relayed)
