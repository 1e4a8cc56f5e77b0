"""What a block sees of the runtime's own types: ``ToolError`` (a helper or tool answered with an
error) and ``HelperGroup`` (``FS``, ``Search``...: helpers named ``<group>.<name>``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class ToolError(RuntimeError):
    """A helper or external tool answered with an error; ``error_type`` names its kind.

    Raised where the code called the helper, so the code can catch it (``except ToolError``).
    """

    def __init__(self, message: str, error_type: str | None = None) -> None:
        super().__init__(message)
        self.error_type = error_type


class RecordTooLarge(ValueError):
    """A sandbox helper's value is too large to journal (the call raises this instead)."""


class HelperGroup:
    """``FS``, ``Bash``, ``Search``, ...: the helpers named ``<group>.<name>``, as attributes.

    Made anew for every block and saved in a snapshot by name only (a variable holding one is
    bound to the next block's group), so nothing of a block's machinery outlives it.
    """

    __slots__ = ("_members", "_name")
    _members: dict[str, Callable[..., Any]]
    _name: str

    def __init__(self, name: str, members: Mapping[str, Callable[..., Any]]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_members", dict(members))

    def __getattr__(self, attr: str) -> Callable[..., Any]:
        try:
            return self._members[attr]
        except KeyError:
            raise AttributeError(
                f"{self._name} has no helper {attr!r} (it has: {', '.join(sorted(self._members))})"
            ) from None

    def __setattr__(self, attr: str, value: object) -> None:
        raise AttributeError(f"the helpers of {self._name} cannot be replaced")

    def __dir__(self) -> list[str]:
        return sorted(self._members)

    def __repr__(self) -> str:
        return f"<helpers {self._name}: {', '.join(sorted(self._members))}>"


def namespace_names(members: Mapping[str, Callable[..., Any]]) -> dict[str, Any]:
    """The namespace entries of the block's helpers: flat names as they are, dotted names
    grouped into one ``HelperGroup`` per prefix."""
    flat: dict[str, Any] = {}
    groups: dict[str, dict[str, Callable[..., Any]]] = {}
    for name, fn in members.items():
        head, dot, attr = name.partition(".")
        if dot:
            groups.setdefault(head, {})[attr] = fn
        else:
            flat[name] = fn
    return {**flat, **{head: HelperGroup(head, group) for head, group in groups.items()}}
