"""``coerce(data, type)``: convert a value to a type, with plain Python first and the model last.

Most conversions an analysis needs are mechanical (``"1,234"`` to ``1234``, ``"yes"`` to ``True``,
``"March 5, 2024"`` to a date) and cost nothing done here; only what plain rules cannot decide
without guessing (``"twelve"``, ``"03/04/2024"``, ``"12k"``) goes to the model, whose answer is
checked against the type like every other binding helper's. Dates and times come back as ISO
8601 strings, because values cross the sandbox boundary as JSON.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import re
from typing import Any, Final

from app.helpers.base import HelperContext, HelperError, HelperSpec, bind_arguments
from app.helpers.llm_call import render_data
from app.helpers.llm_json import Unusable, ask_json
from app.helpers.typespec import TypeSpecError, check, parse_type, type_name

USAGE: Final = 'coerce(data, type)  e.g. coerce("1,234", int), coerce("March 5, 2024", "date")'
_TRUE: Final = frozenset({"true", "yes", "y", "t", "on", "1"})
_FALSE: Final = frozenset({"false", "no", "n", "f", "off", "0"})
_NUMBER: Final = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?([eE][+-]?\d+)?$|^[+-]?\.\d+$")
_CURRENCY: Final = "$€£¥₹"
_DATE_FORMATS: Final = (
    "%Y-%m-%d",
    "%Y/%m/%d",
    "%Y.%m.%d",
    "%d.%m.%Y",
    "%m/%d/%Y",
    "%d/%m/%Y",
    "%B %d, %Y",
    "%b %d, %Y",
    "%B %d %Y",
    "%b %d %Y",
    "%d %B %Y",
    "%d %b %Y",
    "%d %B, %Y",
    "%Y%m%d",
)


class _NeedsModel(Exception):
    """Plain rules cannot convert this value without guessing."""


def _number(value: Any) -> int | float:
    """A number from a number or a plain numeric string (``"1,234.5"``, ``"$12"``, ``" 7 "``)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    if not isinstance(value, str):
        raise _NeedsModel
    text = value.strip().replace("_", "").replace(" ", "").replace("\u00a0", "")
    sign = ""
    if text[:1] in "+-":
        sign, text = text[0], text[1:]
    text = text.lstrip(_CURRENCY)
    if not _NUMBER.match(text):
        raise _NeedsModel
    text = sign + text.replace(",", "")
    number = float(text)
    return int(text) if re.fullmatch(r"[+-]?\d+", text) else number


def _to_int(value: Any) -> int:
    number = _number(value)
    if isinstance(number, float):
        if not number.is_integer():
            raise _NeedsModel  # rounding or truncating is a choice, not a conversion
        return int(number)
    return number


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise _NeedsModel


def _to_date(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _NeedsModel
    text = " ".join(value.strip().split())
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).date().isoformat()
    except ValueError:
        pass
    found = set()
    for fmt in _DATE_FORMATS:
        try:
            found.add(dt.datetime.strptime(text, fmt).date())
        except ValueError:
            continue
    if len(found) != 1:
        raise _NeedsModel  # none, or ambiguous such as 03/04/2024
    return found.pop().isoformat()


def _to_datetime(value: Any) -> str:
    if not isinstance(value, str):
        raise _NeedsModel
    try:
        return dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00")).isoformat()
    except ValueError:
        raise _NeedsModel from None


def _to_time(value: Any) -> str:
    if not isinstance(value, str):
        raise _NeedsModel
    try:
        return dt.time.fromisoformat(value.strip()).isoformat()
    except ValueError:
        raise _NeedsModel from None


def _json_text(value: Any, kind: type) -> Any:
    """A list or dict given as JSON text, parsed."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            raise _NeedsModel from None
        if isinstance(parsed, kind):
            return parsed
    raise _NeedsModel


def plain(value: Any, node: ast.expr) -> Any:
    """``value`` converted to the type ``node`` by fixed rules; _NeedsModel when they cannot decide."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        members = [node.left, node.right]
        if check(value, node) is None:
            return value
        for member in members:
            try:
                return plain(value, member)
            except _NeedsModel:
                continue
        raise _NeedsModel
    if isinstance(node, ast.Subscript):
        return _plain_generic(value, node)
    name = type_name(node)
    if name in ("None", "NoneType"):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
            return None
        raise _NeedsModel
    converters: dict[str, Any] = {
        "int": _to_int,
        "float": lambda v: float(_number(v)),
        "bool": _to_bool,
        "date": _to_date,
        "datetime": _to_datetime,
        "time": _to_time,
        "str": lambda v: v if isinstance(v, str) else json.dumps(v) if isinstance(v, list | dict) else str(v),
        "list": lambda v: v if isinstance(v, list) else _json_text(v, list),
        "tuple": lambda v: v if isinstance(v, list) else _json_text(v, list),
        "set": lambda v: v if isinstance(v, list) else _json_text(v, list),
        "dict": lambda v: v if isinstance(v, dict) else _json_text(v, dict),
    }
    converter = converters.get(name or "")
    if converter is None:
        raise _NeedsModel
    return converter(value)


def _plain_generic(value: Any, node: ast.Subscript) -> Any:
    name = type_name(node.value)
    args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    if name == "Optional":
        return None if value is None else plain(value, args[0])
    if name == "Union":
        for member in args:
            try:
                return plain(value, member)
            except _NeedsModel:
                continue
        raise _NeedsModel
    if name == "Literal":
        allowed = [a.value for a in args if isinstance(a, ast.Constant)]
        for option in allowed:
            if value == option and type(value) is type(option):
                return option
            if isinstance(value, str) and isinstance(option, str) and value.strip().lower() == option.lower():
                return option
        raise _NeedsModel
    if name in ("list", "List", "set", "Set", "Sequence"):
        items = value if isinstance(value, list) else _json_text(value, list)
        return [plain(item, args[0]) for item in items]
    if name in ("dict", "Dict", "Mapping") and len(args) == 2:
        mapping = value if isinstance(value, dict) else _json_text(value, dict)
        return {str(k): plain(v, args[1]) for k, v in mapping.items()}
    if check(value, node) is None:
        return value
    raise _NeedsModel


def _model_prompt(value: Any, type_text: str) -> str:
    return (
        f"{render_data(value, helper='coerce')}\n\nConvert the data above to a value of the Python type "
        f'`{type_text}`. Answer with a JSON object {{"value": <the converted value>}} (dates and times '
        f'as ISO 8601 strings), or {{"error": "<why>"}} if it cannot be converted without inventing '
        f"information."
    )


async def coerce(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``data`` as a value of ``type``: by plain rules when they decide, else by the model."""
    params = bind_arguments(USAGE, args, kwargs, positional=("data", "type"))
    type_arg, value = params["type"], params["data"]
    if not isinstance(type_arg, str):
        raise HelperError(
            f"coerce: type must be a type or its name, e.g. int or 'list[float]'; usage: {USAGE}"
        )
    try:
        node = parse_type(type_arg)
    except TypeSpecError as exc:
        raise HelperError(f"coerce: {exc}") from None
    try:
        return plain(value, node)
    except _NeedsModel:
        pass
    type_text = ast.unparse(node)

    def check_reply(reply: Any) -> tuple[bool, Any]:
        if isinstance(reply, dict) and "error" in reply and "value" not in reply:
            return False, str(reply["error"])
        if not isinstance(reply, dict) or "value" not in reply:
            raise Unusable('expected {"value": ...} or {"error": "..."}')
        if problem := check(reply["value"], node):
            raise Unusable(f'"value": {problem}')
        return True, reply["value"]

    ok, result = await ask_json(
        ctx, helper="coerce", prompt=_model_prompt(value, type_text), check=check_reply
    )
    if not ok:
        raise HelperError(f"coerce: cannot convert {_preview(value)} to {type_text}: {result}")
    if type_name(node) == "float" and isinstance(result, int) and not isinstance(result, bool):
        return float(result)
    return result


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


SPEC = HelperSpec(
    name="coerce",
    signature="coerce(data: Any, type: type | str) -> Any",
    doc="""
Convert a value to a type: `int`, `float`, `bool`, `str`, `date`, `datetime`, `list`, `dict`, or
an annotation such as `"list[float]"`, `"int | None"`, `"Literal['low', 'high']"`.
Plain rules are used when they decide: `"1,234"` -> 1234, `"$12.50"` -> 12.5, `"yes"` -> True,
`"March 5, 2024"` -> "2024-03-05", a JSON string -> list/dict. Anything else (`"twelve"`, `"12k"`,
an ambiguous `"03/04/2024"`) is converted by the model and checked against the type. Dates and
times are returned as ISO 8601 strings. Raises an error when the value cannot be converted.
Example:
    df["revenue"] = [coerce(v, float) for v in df["revenue_text"]]
    when = coerce("5th of March 2024", "date")   # "2024-03-05"
""",
    runs="service",
    handler=coerce,
)
