"""The sandbox helpers (``app.runtime.library``) and a persona's Python tools as the block calls
them: journaled in the child, for the block that runs now (``running``)."""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from app.runtime import library, snapshot
from app.runtime.child import running
from app.runtime.protocol import (
    JOURNALED_SANDBOX_HELPERS,
    bind_params,
    to_json,
)


def _journaled(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The namespace function of a journaled sandbox helper (``FS.write_file``, ...): runs it
    through the running block's journal. Made once, in the worker, so a block does not pay for
    it; saved in a snapshot by name, like every helper."""

    def helper(*args: Any, **kwargs: Any) -> Any:
        if running.block is None:
            raise RuntimeError(f"{name} is used outside of a block")
        return running.block.call_local(name, fn, args, kwargs)

    functools.update_wrapper(helper, fn)
    helper.__qualname__ = name
    return helper


# Persona tool modules compiled in this child, by (file, source): at most once per block.
_tool_modules: dict[tuple[str, str], types.ModuleType] = {}


def _tool_function(*, file: str, function: str, source: str) -> Callable[..., Any]:
    """The persona tool's function, from its source compiled here (the sandbox cannot see the
    persona's files). The module is registered so that objects it defines survive a snapshot:
    cloudpickle stores them by value."""
    key = (file, source)
    module = _tool_modules.get(key)
    if module is None:
        stem = "".join(c if c.isalnum() else "_" for c in Path(file).stem)
        module = types.ModuleType(f"sabre_persona_tools.{stem}_{len(_tool_modules)}")
        module.__file__ = file
        sys.modules[module.__name__] = module
        try:
            exec(compile(source, file, "exec", dont_inherit=True), module.__dict__)
        except BaseException:
            del sys.modules[module.__name__]
            raise
        snapshot.pickle_by_value(module)
        _tool_modules[key] = module
    fn = getattr(module, function, None)
    if not callable(fn):
        raise NameError(f"{Path(file).name} does not define a function {function!r}")
    return fn  # type: ignore[no-any-return]


def sandbox_tool(
    name: str, *, params: Sequence[str], file: str, function: str, source: str
) -> Callable[..., Any]:
    """The namespace function of a persona's Python tool: arguments bound to the schema's
    parameter names, run here, journaled (so a paused block replays it rather than running it
    twice); its result must be JSON, as a journal value and as any tool's result is."""

    def run(**arguments: Any) -> Any:
        value = _tool_function(file=file, function=function, source=source)(**arguments)
        if hasattr(value, "__await__"):  # an async def tool
            import asyncio  # only here: the warm worker does not pay for asyncio

            value = asyncio.run(_awaited(value))
        try:
            return to_json(value, strict=True)
        except TypeError as exc:
            raise TypeError(
                f"{name}() returned {type(value).__name__}, which is not JSON ({exc}); a persona "
                "tool returns dicts, lists, strings, numbers, booleans or None"
            ) from None

    def tool(*args: Any, **kwargs: Any) -> Any:
        block = running.block
        if block is None:
            raise RuntimeError(f"{name} is used outside of a block")
        if block.members.get(name) is not tool:
            # An earlier block's, kept in a value by a live process: the running block's tool of
            # that name (its own source), or the stand-in a restore would have put there.
            return block.own_helper(name)(*args, **kwargs)
        return block.call_local(name, run, (), bind_params(name, params, args, kwargs))

    tool.__name__ = tool.__qualname__ = name
    snapshot.mark_helper(tool, name)
    tool.__doc__ = f"{name}({', '.join(params)}): a tool of this persona."
    return tool


async def _awaited(value: Any) -> Any:
    return await value


# The sandbox helpers as the namespace gets them (before grouping ``FS.*``/``Bash.*``).
LOCAL_MEMBERS: Final[Mapping[str, Callable[..., Any]]] = {
    name: _journaled(name, fn) if name in JOURNALED_SANDBOX_HELPERS else fn
    for name, fn in library.LOCAL_HELPERS.items()
}
