"""Prefixed, URL-safe, sortable-enough identifiers (``conv_…``, ``turn_…``, ``call_…``)."""

from __future__ import annotations

import secrets
import time
from typing import Literal

Prefix = Literal["conv", "turn", "msg", "call", "key", "file", "evt", "delete"]


def new_id(prefix: Prefix) -> str:
    """A new id: prefix, 10 hex digits of milliseconds, 16 random hex digits."""
    return f"{prefix}_{int(time.time() * 1000):010x}{secrets.token_hex(8)}"
