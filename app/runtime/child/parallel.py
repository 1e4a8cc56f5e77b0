"""``parallel(...)``'s plan: which calls, with which arguments, in order (the block batches the
caller's tools among them into one pause)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from app.runtime.protocol import (
    MAX_PARALLEL_CALLS,
)

# ``parallel(calls)`` was called without ``items``.
NO_ITEMS: Final = object()
# One call of the plan: the function, its positional and its keyword arguments.
Planned = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def hashable(value: object) -> bool:
    """Whether ``value`` can be a dict key (``parallel`` looks functions up to find the caller's tools)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


def parallel_plan(calls: Any, items: Any) -> list[Planned]:
    """The calls ``parallel`` was given, as (function, args, kwargs): ``parallel(tool, items)``
    (an item that is a dict gives keyword arguments, any other item the one positional
    argument) or ``parallel(calls)``, each call a ``(function, kwargs)`` or ``(function,)`` pair."""
    planned: list[Planned] = []
    if items is not NO_ITEMS:
        if not callable(calls):
            raise TypeError(f"parallel(tool, items): tool must be a function, not {type(calls).__name__}")
        if isinstance(items, str | bytes | Mapping) or not hasattr(items, "__iter__"):
            raise TypeError(
                "parallel(tool, items): items must be a list (of dicts of keyword arguments, or of "
                f"single arguments), not {type(items).__name__}"
            )
        for item in items:
            if isinstance(item, Mapping):
                planned.append((calls, (), _keywords(item)))
            else:
                planned.append((calls, (item,), {}))
    else:
        if callable(calls) or isinstance(calls, str | bytes | Mapping) or not hasattr(calls, "__iter__"):
            raise TypeError(
                "parallel needs parallel(tool, items) or parallel([(tool, {kwargs}), ...]), not "
                f"one {type(calls).__name__}"
            )
        for position, call in enumerate(calls):
            if not isinstance(call, tuple | list) or not 1 <= len(call) <= 2 or not callable(call[0]):
                raise TypeError(
                    f"parallel: call #{position + 1} must be a (tool, {{keyword arguments}}) pair, "
                    f"not {call!r:.80}"
                )
            keywords = call[1] if len(call) == 2 else {}
            if not isinstance(keywords, Mapping):
                raise TypeError(
                    f"parallel: the arguments of call #{position + 1} must be a dict of keyword "
                    f"arguments, not {type(keywords).__name__}"
                )
            planned.append((call[0], (), _keywords(keywords)))
    if len(planned) > 10 * MAX_PARALLEL_CALLS:
        raise ValueError(f"parallel: {len(planned)} calls at once; split them")
    return planned


def _keywords(mapping: Mapping[Any, Any]) -> dict[str, Any]:
    keys = [key for key in mapping if not isinstance(key, str)]
    if keys:
        raise TypeError(f"parallel: keyword argument names must be strings, not {keys[0]!r:.40}")
    return dict(mapping)
