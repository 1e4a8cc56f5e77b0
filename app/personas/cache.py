"""A per-object memo for values derived from a persona (its prompt prefix, its token count).

Personas are frozen but not hashable (they hold dicts), and ``model_copy`` shares private state,
so values are kept beside the object, keyed by its identity, guarded by a weak reference (an id
is reused once its object is gone) and by a caller-chosen key (e.g. the helper registry it used).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class IdentityCache(Generic[T]):
    """``get(obj, key, compute)``: ``compute()`` once per live object and key."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[object], Hashable, T]] = {}
        self._lock = threading.Lock()

    def get(self, obj: object, key: Hashable, compute: Callable[[], T]) -> T:
        """The cached value for ``obj`` and ``key``, computed on first use."""
        entry = self._entries.get(id(obj))
        if entry is not None and entry[0]() is obj and entry[1] == key:
            return entry[2]
        value = compute()
        ident = id(obj)
        ref = weakref.ref(obj, lambda _: self._entries.pop(ident, None))
        with self._lock:
            self._entries[ident] = (ref, key, value)
        return value

    def clear(self) -> None:
        """Forget everything (tests that change the helper registry in place)."""
        with self._lock:
            self._entries.clear()
