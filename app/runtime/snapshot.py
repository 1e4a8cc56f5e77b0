"""The namespace snapshot codec. Runs in the sandbox child only: the parent never unpickles.

Layout: ``MAGIC``, a u32 length, a JSON header ``{"modules": {alias: module}, "names": [...]}``,
then one cloudpickle pickle of ``{name: value}``.

Why one pickle for all variables rather than one per variable: shared references survive
(``rows = data["rows"]`` still aliases ``data`` in the next block), as they would in a REPL. An
unpicklable value is still dropped alone: when the whole dump fails, each variable is tried on its
own to find the culprits, and the rest is dumped together.

Functions defined in a block are rebound to the live namespace on load (their globals *are* the
namespace, not a frozen copy of what they referenced); helpers, tools and helper groups (``FS``,
``Search``: whatever the block's ``helpers`` mapping holds) are stored by name and resolve to the
fresh ones of the loading block; modules are stored as names and re-imported.
"""

from __future__ import annotations

import importlib
import io
import json
import pickle
import struct
import sys
import types
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final

import cloudpickle

MAGIC: Final = b"SABRENS1"
_LEN: Final = struct.Struct(">I")


class SnapshotTooLarge(Exception):
    """The pickled namespace grew beyond the allowed size."""


class SnapshotFormatError(Exception):
    """The bytes are not a snapshot this version can read."""


class _CappedBuffer(io.BytesIO):
    """A BytesIO that stops the pickler as soon as the snapshot passes ``cap`` bytes."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self._cap = cap

    def write(self, data: Any, /) -> int:
        written = super().write(data)
        if self.tell() > self._cap:
            raise SnapshotTooLarge
        return written


class _NamespaceMarker:
    """Stands for the namespace in a pickled function; loads as the namespace being restored."""

    def __reduce__(self) -> tuple[Callable[[], dict[str, Any]], tuple[()]]:
        return (_loading_namespace, ())


_NAMESPACE: Final = _NamespaceMarker()


class _Loading:
    """What ``_loading_namespace``/``_helper_ref`` resolve to while a snapshot is loaded."""

    namespace: dict[str, Any] | None = None
    helpers: Mapping[str, object] = {}


def _loading_namespace() -> dict[str, Any]:
    if _Loading.namespace is None:
        raise pickle.UnpicklingError("a block function outside of a snapshot load")
    return _Loading.namespace


def _helper_ref(name: str) -> object:
    return resolve_helper(name, _Loading.helpers)


def resolve_helper(name: str, helpers: Mapping[str, object]) -> object:
    """The helper ``name`` of a block's ``helpers``; when it has none, a stand-in that raises
    NameError when called (a variable that held a tool the next block does not get)."""
    helper = helpers.get(name)
    if helper is not None:
        return helper

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise NameError(f"helper {name!r} is not available in this block")

    unavailable.__name__ = unavailable.__qualname__ = name
    return unavailable


# The helpers this process made, by identity (functions only), with their names: stored by name
# wherever they are kept, also by a later block of a live process, which has helpers of its own.
# Not an attribute of the function: ``functools.wraps`` would copy it onto a block's own wrapper.
_MARKED: weakref.WeakKeyDictionary[Callable[..., Any], str] = weakref.WeakKeyDictionary()


def mark_helper(function: Callable[..., Any], name: str) -> None:
    """Remember ``function`` as the helper ``name`` (``helper_name``)."""
    _MARKED[function] = name


def helper_name(obj: object) -> str | None:
    """The name of a helper this process made (``mark_helper``), else None."""
    return _MARKED.get(obj) if type(obj) is types.FunctionType else None


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, plus: block functions keep the namespace as globals, helpers go by name.

    A helper is recognised by identity (any object of the block's ``helpers`` mapping: a
    function, a bound library function, a helper group), so a variable holding one never pickles
    its internals (the block object behind a proxy, the pipes).
    """

    def __init__(self, file: io.BytesIO, *, namespace: dict[str, Any], helpers: Mapping[int, str]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._namespace = namespace
        self._helpers = helpers

    def reducer_override(self, obj: Any) -> Any:
        helper = self._helpers.get(id(obj)) or helper_name(obj)
        if helper is not None:
            return (_helper_ref, (helper,))
        if type(obj) is types.FunctionType and obj.__globals__ is self._namespace:
            return self._block_function_reduce(obj)
        return super().reducer_override(obj)

    def _block_function_reduce(self, func: types.FunctionType) -> Any:
        # cloudpickle would give the function a copy of the globals it references; we want it
        # to see the live namespace instead, and the variables are pickled there anyway.
        make, newargs, (state, slotstate), listitems, dictitems, setstate = self._dynamic_function_reduce(
            func
        )
        newargs = (newargs[0], _NAMESPACE, *newargs[2:])
        slotstate = {**slotstate, "__globals__": {}}
        return (make, newargs, (state, slotstate), listitems, dictitems, setstate)


def _dump(
    values: dict[str, Any], *, cap: int, namespace: dict[str, Any], helpers: Mapping[int, str]
) -> bytes:
    buf = _CappedBuffer(cap)
    _Pickler(buf, namespace=namespace, helpers=helpers).dump(values)
    return buf.getvalue()


def _importable_module(value: Any) -> str | None:
    """The import name of a module that a later block can re-import, else None."""
    if isinstance(value, types.ModuleType):
        name = getattr(value, "__name__", None)
        if isinstance(name, str) and sys.modules.get(name) is value:
            return name
    return None


def pickle_by_value(module: types.ModuleType) -> None:
    """Store what ``module`` defines by value (a persona tool's module, compiled in the child:
    the child that loads the snapshot may not have it)."""
    cloudpickle.register_pickle_by_value(module)


def dump(
    namespace: dict[str, Any],
    *,
    skip: frozenset[str],
    helpers: Mapping[str, object],
    max_bytes: int,
) -> tuple[bytes, list[str]]:
    """Snapshot a namespace; return (snapshot bytes, names of variables dropped as unpicklable).

    ``skip`` names are not saved (helpers, builtins). Raises SnapshotTooLarge past ``max_bytes``.
    """
    helper_ids = {id(fn): name for name, fn in helpers.items()}
    modules: dict[str, str] = {}
    values: dict[str, Any] = {}
    for name, value in namespace.items():
        if name in skip or name.startswith("__"):
            continue
        module = _importable_module(value)
        if module is not None:
            modules[name] = module
        else:
            values[name] = value

    dropped: list[str] = []
    try:
        payload = _dump(values, cap=max_bytes, namespace=namespace, helpers=helper_ids)
    except (SnapshotTooLarge, MemoryError):
        raise
    except BaseException:
        # Find the culprits one by one, then dump the rest together to keep shared references.
        for name in list(values):
            try:
                _dump({name: values[name]}, cap=max_bytes, namespace=namespace, helpers=helper_ids)
            except (SnapshotTooLarge, MemoryError):
                raise
            except BaseException:
                dropped.append(name)
                del values[name]
        try:
            payload = _dump(values, cap=max_bytes, namespace=namespace, helpers=helper_ids)
        except (SnapshotTooLarge, MemoryError):
            raise
        except BaseException:
            dropped.extend(values)
            values = {}
            payload = _dump(values, cap=max_bytes, namespace=namespace, helpers=helper_ids)

    header = json.dumps({"modules": modules, "names": list(values)}).encode()
    data = MAGIC + _LEN.pack(len(header)) + header + payload
    if len(data) > max_bytes:
        raise SnapshotTooLarge
    return data, dropped


def load(data: bytes, *, namespace: dict[str, Any], helpers: Mapping[str, object]) -> list[str]:
    """Restore a snapshot into ``namespace``; return the names that could not be restored."""
    if not data.startswith(MAGIC):
        raise SnapshotFormatError("not a namespace snapshot of this runtime version")
    start = len(MAGIC) + _LEN.size
    try:
        (header_len,) = _LEN.unpack_from(data, len(MAGIC))
        header = json.loads(data[start : start + header_len])
        modules: dict[str, str] = dict(header["modules"])
        names: list[str] = list(header["names"])
    except (struct.error, ValueError, TypeError, KeyError) as exc:
        raise SnapshotFormatError(f"the snapshot header is damaged: {exc}") from None

    dropped: list[str] = []
    for alias, module in modules.items():
        try:
            namespace[alias] = importlib.import_module(module)
        except MemoryError:
            raise
        except BaseException:
            dropped.append(alias)

    _Loading.namespace, _Loading.helpers = namespace, helpers
    try:
        values = pickle.loads(memoryview(data)[start + header_len :])
    except MemoryError:
        raise
    except BaseException:
        # One pickle for all: if it cannot load (a class whose module is gone), all are lost.
        return dropped + names
    finally:
        _Loading.namespace, _Loading.helpers = None, {}
    namespace.update(values)
    return dropped
