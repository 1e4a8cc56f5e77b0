"""The external tools a chat declares (``sabre chat --tools FILE``): a JSON list in either OpenAI
function-tool shape; the server checks them when the conversation starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

MAX_TOOLS_FILE_BYTES = 1_000_000


def load_tools(path: Path | None) -> list[dict[str, Any]]:
    """The tools in ``path`` (none without a file); a clear CLI error for a bad file."""
    if path is None:
        return []
    try:
        if path.stat().st_size > MAX_TOOLS_FILE_BYTES:
            raise typer.BadParameter(f"{path}: over {MAX_TOOLS_FILE_BYTES} bytes", param_hint="--tools")
        tools = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--tools") from None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise typer.BadParameter(f"{path}: expected a JSON list of tool objects", param_hint="--tools")
    return tools
