"""``llm_bind`` and ``llm_list_bind``: structured values extracted from free data by the model.

``llm_bind(data, "func(sig) -> type")`` has the model bind the data to a function signature: the
arguments it finds, checked against their annotations, or, when the signature declares a non-dict
return type, the value such a function would return. ``llm_list_bind`` extracts a list. Both speak
strict JSON with the model (``app.helpers.llm_json``) so the caller gets plain Python values.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Final

from app.helpers.base import HelperContext, HelperError, HelperSpec, bind_arguments
from app.helpers.llm_call import render_data
from app.helpers.llm_json import Unusable, ask_json
from app.helpers.typespec import check, is_known, is_mapping, is_optional

MAX_SIGNATURE_CHARS: Final = 2_000
_NO_DEFAULT: Final = object()


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a bound signature."""

    name: str
    annotation: ast.expr | None
    default: Any = _NO_DEFAULT

    @property
    def required(self) -> bool:
        """No default, and ``None`` is not a value of its type (an unannotated one needs a value)."""
        if self.default is not _NO_DEFAULT:
            return False
        return self.annotation is None or not is_optional(self.annotation)


@dataclass(frozen=True, slots=True)
class Signature:
    """A function signature the model binds data to."""

    text: str
    params: tuple[Param, ...]
    returns: ast.expr | None

    @property
    def wants_result(self) -> bool:
        """Whether the caller asked for the function's return value rather than its arguments:
        a return type that is neither absent, nor ``dict``, nor a class of the caller's own."""
        return not is_mapping(self.returns) and self.returns is not None and is_known(self.returns)


def parse_signature(text: Any) -> Signature:
    """``"name(a: int, b: str = 'x') -> T"`` (``def`` and the name optional) as a Signature."""
    if not isinstance(text, str) or not text.strip():
        raise HelperError(
            'llm_bind: signature must be a string such as "person(name: str, age: int) -> dict"'
        )
    if len(text) > MAX_SIGNATURE_CHARS:
        raise HelperError(f"llm_bind: the signature is over {MAX_SIGNATURE_CHARS} characters")
    source = text.strip().removeprefix("def ").strip().rstrip(":").strip()
    if source.startswith("("):
        source = "bind" + source
    try:
        tree = ast.parse(f"def {source}: pass")
    except SyntaxError as exc:
        raise HelperError(f"llm_bind: {text!r} is not a function signature: {exc.msg}") from None
    func = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(func, ast.FunctionDef):
        raise HelperError(f"llm_bind: {text!r} is not one function signature")
    args = func.args
    if args.vararg or args.kwarg:
        raise HelperError("llm_bind: the signature cannot take *args or **kwargs; name each parameter")
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    pairs = [*zip(positional, defaults, strict=True), *zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    params: list[Param] = []
    for arg, default in pairs:
        if default is None:
            params.append(Param(arg.arg, arg.annotation))
            continue
        try:
            value = ast.literal_eval(default)
        except ValueError:
            raise HelperError(f"llm_bind: the default of {arg.arg!r} must be a literal value") from None
        params.append(Param(arg.arg, arg.annotation, value))
    if not params:
        raise HelperError("llm_bind: the signature has no parameters to bind")
    return Signature(
        text=ast.unparse(func).removesuffix(": pass").removeprefix("def ").strip(),
        params=tuple(params),
        returns=func.returns,
    )


def _prompt(body: str, sig: Signature) -> str:
    names = ", ".join(p.name for p in sig.params)
    lines = [
        body,
        "",
        "Bind the data above to this Python function:",
        "",
        f"    def {sig.text}",
        "",
    ]
    if sig.wants_result:
        returns = ast.unparse(sig.returns) if sig.returns is not None else "Any"
        lines.append(
            f'Answer with a JSON object {{"arguments": {{...}}, "result": ...}}. "arguments" has one entry '
            f'per parameter ({names}): the value the data gives for it. "result" is the value this '
            f"function returns for those arguments, of type {returns}, as the data shows it."
        )
    else:
        lines.append(
            f'Answer with a JSON object {{"arguments": {{...}}}} with one entry per parameter ({names}): '
            f"the value the data gives for it."
        )
    lines.append(
        "Values must have the annotated types (JSON strings, numbers, true/false, arrays, objects); "
        "dates and times as ISO 8601 strings. For a parameter the data gives no value for, use its "
        "default, or null when it has none."
    )
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Bound:
    arguments: dict[str, Any]
    result: Any
    missing: tuple[str, ...]


def _checker(sig: Signature) -> Any:
    def check_reply(value: Any) -> _Bound:
        if not isinstance(value, dict) or not isinstance(value.get("arguments"), dict):
            raise Unusable('expected a JSON object with an "arguments" object')
        given: dict[str, Any] = value["arguments"]
        unknown = sorted(set(given) - {p.name for p in sig.params})
        if unknown:
            raise Unusable(f"unknown parameter(s) {', '.join(unknown)}; the parameters are the signature's")
        arguments: dict[str, Any] = {}
        missing: list[str] = []
        for param in sig.params:
            item = given.get(param.name)
            if item is None:
                if param.default is not _NO_DEFAULT:
                    item = param.default
                elif param.required:
                    missing.append(param.name)
            elif param.annotation is not None and (problem := check(item, param.annotation)):
                raise Unusable(f"parameter {param.name!r}: {problem}")
            arguments[param.name] = item
        result = None
        if sig.wants_result:
            if "result" not in value:
                raise Unusable('the answer has no "result"')
            result = value["result"]
            if sig.returns is not None and (problem := check(result, sig.returns)):
                raise Unusable(f'"result": {problem}')
        return _Bound(arguments, result, tuple(missing))

    return check_reply


BIND_USAGE = 'llm_bind(data, signature)  e.g. llm_bind(text, "person(name: str, age: int) -> dict")'


async def llm_bind(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Bind ``data`` to ``signature``; the arguments as a dict, or the declared return value."""
    params = bind_arguments(BIND_USAGE, args, kwargs, positional=("data", "signature"))
    sig = parse_signature(params["signature"])
    body = render_data(params["data"], helper="llm_bind")
    bound = await ask_json(ctx, helper="llm_bind", prompt=_prompt(body, sig), check=_checker(sig))
    if sig.wants_result:
        return bound.result
    if bound.missing:
        raise HelperError(f"llm_bind: the data gives no value for {', '.join(map(repr, bound.missing))}")
    return bound.arguments


BIND_SPEC = HelperSpec(
    name="llm_bind",
    signature="llm_bind(data: Any, signature: str) -> Any",
    doc="""
Extract structured values from free data (text, pages, dicts) by binding it to a Python function
signature, given as a string: `"name(param: type, ...) -> return_type"`.
Returns a dict of the parameters' values (each checked against its annotation; a parameter with a
default falls back to it) when the return type is left out, is `dict`, or is a class of your own.
With any other return type (`int`, `str`, `list[dict]`, `bool`, ...) it returns the value that
function would return for the data, checked against that type. Dates come back as ISO strings.
Raises an error when the data has no value for a required parameter (make it `T | None` or give
it a default to accept a missing value).
Examples:
    person = llm_bind(bio_text, "person(name: str, born: int, city: str | None = None) -> dict")
    print(person["name"], person["born"])
    total = llm_bind(invoice_text, "invoice_total(currency: str) -> float")
""",
    runs="service",
    handler=llm_bind,
)


LIST_USAGE = "llm_list_bind(data, instructions, count=None)"


async def llm_list_bind(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> list[Any]:
    """A JSON list extracted from ``data`` as ``instructions`` say, at most ``count`` items."""
    params = bind_arguments(
        LIST_USAGE, args, kwargs, positional=("data", "instructions", "count"), defaults={"count": None}
    )
    instructions, count = params["instructions"], params["count"]
    if not isinstance(instructions, str) or not instructions.strip():
        raise HelperError("llm_list_bind: instructions must be a non-empty string")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise HelperError("llm_list_bind: count must be a positive integer or None")
    body = render_data(params["data"], helper="llm_list_bind")
    limit = f", at most {count} items" if count else ""
    prompt = (
        f"{body}\n\nInstructions: {instructions}\n\nAnswer with a JSON array of the items the "
        f"instructions ask for{limit}, in the order they appear in the data: each item a string, "
        f"number or object as fits the instructions (objects with the same keys in every item). "
        f"Answer [] if there are none."
    )

    def check_reply(value: Any) -> list[Any]:
        if isinstance(value, dict) and len(value) == 1 and isinstance(next(iter(value.values())), list):
            value = next(iter(value.values()))  # {"items": [...]}
        if not isinstance(value, list):
            raise Unusable("expected a JSON array")
        return value

    items = await ask_json(ctx, helper="llm_list_bind", prompt=prompt, check=check_reply)
    return items[:count] if count else items


LIST_SPEC = HelperSpec(
    name="llm_list_bind",
    signature="llm_list_bind(data: Any, instructions: str, count: int | None = None) -> list",
    doc="""
Extract a list from free data: the model reads `data` and returns the items `instructions` ask
for, as a Python list (strings, numbers, or dicts with the same keys), in the data's order, at
most `count` of them when given. An empty list means none were found.
Example:
    names = llm_list_bind(article, "the names of every company mentioned")
    rows = llm_list_bind(page_text, "each product as {name, price}", count=10)
""",
    runs="service",
    handler=llm_list_bind,
)

SPECS: tuple[HelperSpec, ...] = (BIND_SPEC, LIST_SPEC)
