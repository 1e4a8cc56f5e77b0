"""Which workers a block runs on: the ones whose zygote preloaded the heavy modules (numpy,
pandas, matplotlib by default), or plain ones that hold only the runtime.

A fresh block's process is a fork of its worker, and the fork, its exit and the copy-on-write
faults between them cost in proportion to the heap the worker holds: about 10.7 ms of CPU per
trivial block with the default preloads against 6.4 ms without them (``bench/fork_bench.py``).
Most blocks (tools, files, text) never touch those modules, so when the pool has plain workers,
a block goes to them unless its code, its sandbox tools or the namespace it restores name a
preloaded module (or the usual alias, or a helper that returns one of their objects).

The test is on words, not on what the code will do: a false positive runs the block where it
would have run anyway; a block that reaches a module by a name built at run time
(``__import__("num" + "py")``) imports it in the plain process, which is slower but the same.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final, Literal

Tier = Literal["preloaded", "plain"]

# A snapshot larger than this is not searched (about 1 ms per MiB, on the server's event loop,
# before each fresh block): its conversation runs on the preloaded workers, as all did before.
SCAN_BYTES: Final = 1 << 20

# Names a block uses a preloaded module by, beyond the module's own: its usual alias, and the
# runtime's helper that returns its objects.
_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "numpy": ("np",),
    "pandas": ("pd", "pandas_bind"),
    "matplotlib": ("mpl", "plt", "pyplot"),
}


class TierRule:
    """Decides a block's tier for one pool's preload list (compiled once)."""

    def __init__(self, preload: Sequence[str]) -> None:
        self.roots = tuple(dict.fromkeys(name.split(".")[0] for name in preload if name))
        words = [*self.roots, *(alias for root in self.roots for alias in _ALIASES.get(root, ()))]
        self._words = re.compile(r"\b(?:" + "|".join(map(re.escape, words)) + r")\b") if words else None
        self._marks = tuple(root.encode() for root in self.roots)

    def tier(self, code: str, *, snapshot: bytes, sources: Iterable[str] = ()) -> Tier:
        """``preloaded`` when the block's ``code`` or a sandbox tool's source names a preloaded
        module (or its alias), or when its ``snapshot`` refers to one (a pickled array or frame
        names its module) or is too large to search (``SCAN_BYTES``); ``plain`` otherwise."""
        if self._words is None:
            return "plain"
        if self._words.search(code) or any(self._words.search(source) for source in sources):
            return "preloaded"
        if len(snapshot) > SCAN_BYTES or (snapshot and any(mark in snapshot for mark in self._marks)):
            return "preloaded"
        return "plain"
