"""Python type annotations, given as text, checked against JSON values.

``llm_bind``, ``llm_list_bind`` and ``coerce`` take types the model wrote (``"list[int]"``,
``"str | None"``, ``int`` arriving as ``"<class 'int'>"``); the model's answers are checked against
them before they reach the caller, so a wrong shape is caught here (and the model asked again)
instead of failing later in the user's code. Dates and times are ISO 8601 strings, because values
cross the sandbox boundary as JSON. Names this module does not know (a user's class such as
``Person``) accept any value.
"""

from __future__ import annotations

import ast
import datetime as dt
import re
from typing import Any

_CLASS_REPR = re.compile(r"^<class '([A-Za-z_][A-Za-z0-9_.]*)'>$")
_LIST = frozenset({"list", "List", "Sequence", "Iterable", "set", "Set", "frozenset", "FrozenSet"})
_DICT = frozenset({"dict", "Dict", "Mapping"})
_TUPLE = frozenset({"tuple", "Tuple"})
_ANY = frozenset({"Any", "object"})


class TypeSpecError(ValueError):
    """The text is not a type annotation."""


def parse_type(text: str) -> ast.expr:
    """An annotation as an expression tree; ``"<class 'int'>"`` (a class passed as a value) is ``int``."""
    source = text.strip()
    match = _CLASS_REPR.match(source)
    if match:
        source = match.group(1)
    try:
        return ast.parse(source, mode="eval").body
    except SyntaxError:
        raise TypeSpecError(
            f"{text!r} is not a type (e.g. int, float, bool, date, list[str], dict)"
        ) from None


def type_name(node: ast.expr) -> str | None:
    """The last part of a plain or dotted name (``datetime.date`` -> ``date``), else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and node.value is None:
        return "None"
    return None


def _parts(node: ast.expr) -> list[ast.expr]:
    """The members of a ``X | Y`` union or of a subscript's tuple of arguments."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return [*_parts(node.left), *_parts(node.right)]
    return [node]


def _args(node: ast.Subscript) -> list[ast.expr]:
    inner = node.slice
    return list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]


def is_optional(node: ast.expr) -> bool:
    """Whether ``None`` is a valid value of the type."""
    return check(None, node) is None


def is_mapping(node: ast.expr | None) -> bool:
    """Whether the type is ``dict`` (bare or parameterised) or absent."""
    if node is None:
        return True
    head = node.value if isinstance(node, ast.Subscript) else node
    return type_name(head) in _DICT


def is_known(node: ast.expr) -> bool:
    """Whether the type is one this module checks (not a user class accepting anything)."""
    known = {"str", "int", "float", "bool", "None", "NoneType", "date", "datetime", "time"}
    known |= _LIST | _DICT | _TUPLE | {"Optional", "Union", "Literal"}
    if isinstance(node, ast.Subscript):
        return type_name(node.value) in known
    if isinstance(node, ast.BinOp):
        return all(is_known(p) for p in _parts(node))
    return type_name(node) in known


def _iso(value: Any, parse: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parse(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def check(value: Any, node: ast.expr) -> str | None:
    """None when the JSON ``value`` is of type ``node``, else a short reason why not."""
    union = _parts(node)
    if len(union) > 1:
        reasons = [check(value, part) for part in union]
        return None if any(r is None for r in reasons) else f"{value!r} is not {ast.unparse(node)}"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return check(value, parse_type(node.value))  # a forward reference: "list[int]"
    if isinstance(node, ast.Subscript):
        return _check_generic(value, node)
    name = type_name(node)
    problem = f"{value!r} is not {ast.unparse(node)}"
    if name in _ANY or name is None:
        return None
    if name in ("None", "NoneType"):
        return None if value is None else problem
    if name == "str":
        return None if isinstance(value, str) else problem
    if name == "bool":
        return None if isinstance(value, bool) else problem
    if name == "int":
        return None if isinstance(value, int) and not isinstance(value, bool) else problem
    if name == "float":
        return None if isinstance(value, int | float) and not isinstance(value, bool) else problem
    if name in _LIST or name in _TUPLE:
        return None if isinstance(value, list) else problem
    if name in _DICT:
        return None if isinstance(value, dict) else problem
    if name == "date":
        return None if _iso(value, dt.date.fromisoformat) else f"{value!r} is not an ISO date (YYYY-MM-DD)"
    if name == "datetime":
        return None if _iso(value, dt.datetime.fromisoformat) else f"{value!r} is not an ISO date-time"
    if name == "time":
        return None if _iso(value, dt.time.fromisoformat) else f"{value!r} is not an ISO time (HH:MM:SS)"
    return None  # a class of the user's: any JSON value may stand for it


def _check_generic(value: Any, node: ast.Subscript) -> str | None:
    """``list[X]``, ``dict[K, V]``, ``tuple[...]``, ``Optional[X]``, ``Union[...]``, ``Literal[...]``."""
    name = type_name(node.value)
    args = _args(node)
    problem = f"{value!r} is not {ast.unparse(node)}"
    if name == "Optional":
        return None if value is None else check(value, args[0])
    if name == "Union":
        return None if any(check(value, a) is None for a in args) else problem
    if name == "Literal":
        allowed = [a.value for a in args if isinstance(a, ast.Constant)]
        return None if any(value == a and type(value) is type(a) for a in allowed) else problem
    if name in _LIST:
        if not isinstance(value, list):
            return problem
        return next((f"item {i}: {r}" for i, v in enumerate(value) if (r := check(v, args[0]))), None)
    if name in _TUPLE:
        if not isinstance(value, list):
            return problem
        if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is Ellipsis:
            return next((f"item {i}: {r}" for i, v in enumerate(value) if (r := check(v, args[0]))), None)
        if len(value) != len(args):
            return f"{value!r} should have {len(args)} items"
        return next(
            (
                f"item {i}: {r}"
                for i, (v, a) in enumerate(zip(value, args, strict=True))
                if (r := check(v, a))
            ),
            None,
        )
    if name in _DICT:
        if not isinstance(value, dict):
            return problem
        if len(args) == 2:
            return next((f"key {k!r}: {r}" for k, v in value.items() if (r := check(v, args[1]))), None)
        return None
    return None  # a generic class of the user's
