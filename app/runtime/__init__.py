"""The sandbox runtime: runs one ``<helpers>`` block of untrusted Python in a child process.

Public names are imported lazily: the sandbox worker (``python -m app.runtime.worker``) imports
this package too, and must not pay for pydantic and asyncio (idle worker memory, DESIGN.md §9).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.runtime.child.namespace import ToolError
    from app.runtime.pool import RuntimePool
    from app.runtime.protocol import call_digest, decode_header, encode_frame
    from app.runtime.schemas import BlockOutcome, CallReply, HelperCall, JournalEntry, Limits, SandboxTool

__all__ = [
    "BlockOutcome",
    "CallReply",
    "HelperCall",
    "JournalEntry",
    "Limits",
    "RuntimePool",
    "SandboxTool",
    "ToolError",
    "call_digest",
    "decode_header",
    "encode_frame",
]

_HOMES = {
    "RuntimePool": "app.runtime.pool",
    "ToolError": "app.runtime.child.namespace",
    "call_digest": "app.runtime.protocol",
    "decode_header": "app.runtime.protocol",
    "encode_frame": "app.runtime.protocol",
    "BlockOutcome": "app.runtime.schemas",
    "CallReply": "app.runtime.schemas",
    "HelperCall": "app.runtime.schemas",
    "JournalEntry": "app.runtime.schemas",
    "Limits": "app.runtime.schemas",
    "SandboxTool": "app.runtime.schemas",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'app.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
