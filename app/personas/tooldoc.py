"""Render a function tool (name, description, JSON Schema parameters) as Python documentation.

The model calls tools as Python functions, so their docs in the prompt are Python signatures, not
JSON Schema: ``get_order_details(*, order_id: str) -> dict``. Signatures are keyword-only because a
JSON Schema object has no positional order that callers agree on. Rendering is pure and stable
(same schema, same bytes), which keeps the prompt byte-identical across turns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

_SCALARS: dict[str, str] = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "null": "None",
    "object": "dict",
    "array": "list",
}
_MAX_DEPTH = 3


def _is_map(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, with the common case (a dict) first: ABC checks are slow."""
    return isinstance(value, (dict, Mapping))


def _union(parts: Sequence[str]) -> str:
    """``a | b`` without repeats, in first-seen order."""
    unique = list(dict.fromkeys(parts))
    return " | ".join(unique) if unique else "Any"


def annotation(schema: Any, *, depth: int = 0) -> str:
    """A Python type annotation for a JSON Schema (``Literal`` for enums, ``list[...]`` for arrays)."""
    if not _is_map(schema) or depth > _MAX_DEPTH:
        return "Any"
    if "enum" in schema and isinstance(schema["enum"], list):
        return f"Literal[{', '.join(repr(v) for v in schema['enum'])}]"
    if "const" in schema:
        return f"Literal[{schema['const']!r}]"
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return _union([annotation(s, depth=depth + 1) for s in schema[key]])
    if isinstance(schema.get("$ref"), str):
        return schema["$ref"].rsplit("/", 1)[-1] or "Any"
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union([annotation({**schema, "type": k}, depth=depth) for k in kind])
    if kind == "array":
        items = schema.get("items")
        return f"list[{annotation(items, depth=depth + 1)}]" if _is_map(items) else "list"
    if isinstance(kind, str):
        return _SCALARS.get(kind, "Any")
    return "Any"


def shape(schema: Any, *, depth: int = 0) -> str | None:
    """A compact picture of an object schema's keys, e.g. ``{flight_number: str, date: str}``.

    ``None`` when the schema (or the items of an array schema) has no declared properties.
    """
    if not _is_map(schema) or depth > _MAX_DEPTH:
        return None
    if schema.get("type") == "array":
        inner = shape(schema.get("items"), depth=depth + 1)
        return f"[{inner}, ...]" if inner else None
    props = schema.get("properties")
    if not _is_map(props) or not props:
        return None
    required = set(schema.get("required") or ())
    fields = []
    for key, sub in props.items():
        inner = shape(sub, depth=depth + 1)
        optional = "" if key in required else "?"
        fields.append(f"{key}{optional}: {inner or annotation(sub, depth=depth + 1)}")
    return "{" + ", ".join(fields) + "}"


def _default(schema: Mapping[str, Any]) -> str:
    """The ``= value`` of an optional parameter (the schema's default, else ``None``)."""
    if "default" in schema:
        return repr(schema["default"])
    return "None"


def signature(name: str, parameters: Mapping[str, Any], *, returns: str | None = None) -> str:
    """``name(*, a: str, b: int = 0) -> returns``: required parameters first, keyword-only."""
    props = parameters.get("properties")
    props = props if _is_map(props) else {}
    required = [p for p in (parameters.get("required") or ()) if p in props]
    optional = [p for p in props if p not in required]
    params = [f"{p}: {annotation(props[p])}" for p in required]
    for p in optional:
        sub = props[p] if _is_map(props[p]) else {}
        kind = annotation(sub)
        if "default" not in sub and kind != "Any" and "None" not in kind.split(" | "):
            kind = f"{kind} | None"
        params.append(f"{p}: {kind} = {_default(sub)}")
    args = "*, " + ", ".join(params) if params else ""
    return f"{name}({args}) -> {returns or 'Any'}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def render_tool(
    name: str,
    description: str,
    parameters: Mapping[str, Any],
    *,
    returns: str | None = None,
    returns_description: str | None = None,
) -> str:
    """The full prompt documentation of one tool: signature, description, parameters, returns."""
    lines = [f"### {signature(name, parameters, returns=returns)}"]
    if description.strip():
        lines.append(description.strip())
    props = parameters.get("properties")
    params = []
    if _is_map(props):
        for key, sub in props.items():
            sub = sub if _is_map(sub) else {}
            text = _one_line(str(sub.get("description", "")))
            detail = shape(sub)
            if detail:
                text = f"{text} Shape: {detail}." if text else f"Shape: {detail}."
            if text:  # the signature already says the rest (type, default, allowed values)
                params.append(f"- {key}: {text}")
    if params:
        lines += ["Parameters:", *params]
    if returns_description and returns_description.strip():
        lines.append(f"Returns: {_one_line(returns_description)}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class FunctionToolDoc:
    """A tool declared outside a persona (a request's ``tools``), documented like a persona's tool.

    Satisfies :class:`app.personas.prompt.ToolDoc`.
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    returns: str | None = None
    returns_description: str | None = None

    def render(self) -> str:
        """Python signature, description and parameters, as the prompt shows them."""
        return render_tool(
            self.name,
            self.description,
            self.parameters,
            returns=self.returns,
            returns_description=self.returns_description,
        )
