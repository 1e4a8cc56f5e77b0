"""A hostile MCP server over stdio for tests/tools/test_attacker_mcp.py: raw JSON-RPC lines (no SDK, so
that it can send what the SDK never would), each tool misbehaving its own way."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

TOOLS = ["ok", "bad_utf8", "flood", "pid", "huge_text", "endless_line", "garbage"]
out = sys.stdout.buffer


def send(message: dict[str, Any]) -> None:
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()


def text(request_id: int, value: str) -> None:
    send({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": value}]}})


def call(request_id: int, name: str, n: int) -> None:
    if name == "ok":
        text(request_id, "fine")
    elif name == "bad_utf8":  # bytes that are not UTF-8 inside a well-formed line
        content = b'[{"type":"text","text":"a\xff\xfeb"}]'
        out.write(b'{"jsonrpc":"2.0","id":%d,"result":{"content":%s}}\n' % (request_id, content))
        out.flush()
    elif name == "flood":
        for _ in range(n):
            log = {"level": "info", "data": "z" * 100}
            send({"jsonrpc": "2.0", "method": "notifications/message", "params": log})
        text(request_id, "after the flood")
    elif name == "pid":  # which process answers, to see it stopped or restarted
        text(request_id, str(os.getpid()))
    elif name == "huge_text":  # one well-formed line of a little over n bytes
        text(request_id, "x" * n)
    elif name == "endless_line":  # n bytes of a line that does not end, then silence with stdout open
        chunk = b"y" * 65536
        for _ in range(n // len(chunk)):
            out.write(chunk)
        out.write(b"y" * (n % len(chunk)))
        out.flush()
        while True:
            time.sleep(60)
    elif name == "garbage":  # a line that is not JSON-RPC, then the answer
        out.write(b"this is not json\n")
        text(request_id, "after the garbage")


def main() -> None:
    for line in sys.stdin.buffer:
        message = json.loads(line)
        request_id, method = message.get("id"), message.get("method")
        if request_id is None:
            continue  # a notification
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
            send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif method == "tools/list":
            schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
            tools = [{"name": name, "inputSchema": schema} for name in TOOLS]
            send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}})
        elif method == "tools/call":
            params = message["params"]
            call(request_id, params["name"], int(params.get("arguments", {}).get("n", 0)))
        else:
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})


if __name__ == "__main__":
    main()
