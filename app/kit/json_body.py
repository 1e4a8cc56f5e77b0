"""The JSON the API accepts: RFC 8259 (finite numbers only), nested at most ``MAX_DEPTH`` levels.

Python's ``json`` reads ``NaN``, ``Infinity`` and ``1e400`` (as inf), which the store would keep as
non-standard JSON (PostgreSQL refuses it outright), and a body nested thousands of levels deep fails
with a RecursionError wherever it is walked next; PostgreSQL refuses a NUL character anywhere (in
bodies, paths and queries alike). Routers parse requests through ``StrictJSONRoute``, so all three are
a 422 before endpoint code runs; ``nesting_path`` bounds other caller JSON (tool schemas).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any, Final, NoReturn

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from app.kit.errors import Unprocessable

MAX_DEPTH: Final = 64
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

Path = list[str | int]


def nesting_path(value: Any, *, limit: int = MAX_DEPTH) -> Path | None:
    """The path to the first array or object nested deeper than ``limit`` levels, else None.

    Iterative, so any depth is safe to check; only containers are visited.
    """
    if not isinstance(value, dict | list):
        return None
    # Each entry: a container, its depth, and its path as a linked list (key, parent link).
    stack: list[tuple[Any, int, tuple[Any, ...] | None]] = [(value, 1, None)]
    while stack:
        node, depth, link = stack.pop()
        if depth > limit:
            path: Path = []
            while link is not None:
                path.append(link[0])
                link = link[1]
            return path[::-1]
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1, (key, link)))
    return None


def too_deep(what: str, path: Path | None = None) -> Unprocessable:
    """The 422 for JSON nested past ``MAX_DEPTH``, showing where (abridged) when known."""
    where = ""
    if path:
        shown = ".".join(str(part) for part in path[:12])
        where = f" at {shown}{'.…' if len(path) > 12 else ''}"
    return Unprocessable(
        f"{what} nests deeper than {MAX_DEPTH} levels{where}.",
        extra={
            "errors": [
                {"loc": path or [], "msg": f"nested deeper than {MAX_DEPTH} levels", "type": "json_depth"}
            ]
        },
    )


def _not_a_number(token: str) -> NoReturn:
    raise Unprocessable(
        f"The request body is not RFC 8259 JSON: {token[:40]} is not a finite number.",
        extra={"errors": [{"loc": [], "msg": f"{token[:40]} is not a JSON number", "type": "json_number"}]},
    )


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        _not_a_number(text)
    return value


def nul_path(value: Any) -> Path | None:
    """The path to the first string (value or key) holding a NUL character, else None.

    PostgreSQL keeps no NUL in text or jsonb (the write fails), so the API accepts none on any store.
    """
    stack: list[tuple[Any, Path]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return path
        elif isinstance(node, dict):
            for key, child in node.items():
                if "\x00" in key:
                    return [*path, key]
                stack.append((child, [*path, key]))
        elif isinstance(node, list):
            stack.extend((child, [*path, index]) for index, child in enumerate(node))
    return None


def surrogate_path(value: Any) -> Path | None:
    """The path to the first string (value or key) holding a lone surrogate, else None.

    JSON escapes one half of a pair alone (``"\\ud800"``), and ``json`` reads it (and its raw UTF-8
    bytes) as is; no UTF-8 encoder takes it, so once stored it made every response that carries it,
    and every model request, fail (a 500 on GET, a listing of the tenant's conversations, a turn).
    """
    stack: list[tuple[Any, Path]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return path
        elif isinstance(node, dict):
            for key, child in node.items():
                if _SURROGATE.search(key):
                    return [*path, key]
                stack.append((child, [*path, key]))
        elif isinstance(node, list):
            stack.extend((child, [*path, index]) for index, child in enumerate(node))
    return None


_SURROGATE: Final = re.compile("[\ud800-\udfff]")
# How a lone surrogate can be written in a body: a \uD8xx-\uDFxx escape (a valid pair too, which
# the walk then finds paired), or its three raw bytes (ED A0-BF xx), which ``json`` also decodes.
_SURROGATE_IN_BYTES: Final = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE_IN_TEXT: Final = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


def load_stored(text: str) -> Any:
    """A JSON column's value as read from the store, a lone surrogate in it replaced by U+FFFD.

    Bodies holding one are refused (``surrogate_path``), but rows stored before that (or by a path
    that missed it) made every answer that carries them a 500: the conversation, its messages, and
    the listing of every conversation of its tenant. Read through this, the row serves again (a
    later write stores it mended). The walk runs only when the text has such an escape."""
    value = json.loads(text)
    # A stored text is UTF-8, so one can only be written as an escape (a pair's too: then the walk
    # finds it paired). Two substring scans: a regex costs ten times the parse.
    if "\\ud" not in text and "\\uD" not in text:
        return value
    return _mended(value)


def _mended(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_SURROGATE.sub("\ufffd", key): _mended(child) for key, child in value.items()}
    if isinstance(value, list):
        return [_mended(child) for child in value]
    return value


def has_surrogate(what: str, path: Path) -> Unprocessable:
    """The 422 for a lone surrogate in a request string."""
    # The key that holds it is shown escaped: the answer must itself be UTF-8.
    loc = [
        part.encode("utf-8", "backslashreplace").decode() if isinstance(part, str) else part for part in path
    ]
    shown = ".".join(str(part) for part in loc[:12]) or what
    return Unprocessable(
        f"{shown}: not valid Unicode (a lone surrogate, \\ud800-\\udfff without its pair).",
        extra={"errors": [{"loc": loc, "msg": "contains a lone surrogate", "type": "string_unicode"}]},
    )


def has_nul(what: str, path: Path) -> Unprocessable:
    """The 422 for a NUL character in a request string."""
    shown = ".".join(str(part).replace("\x00", "\\u0000") for part in path[:12]) or what
    return Unprocessable(
        f"{shown}: NUL characters (\\u0000) are not accepted.",
        extra={"errors": [{"loc": path, "msg": "contains a NUL character", "type": "string_nul"}]},
    )


def loads(data: bytes | str) -> Any:
    """Parse a request body as RFC 8259 JSON of bounded depth; ``Unprocessable`` when it is not.

    Malformed JSON still raises ``ValueError`` (``json.JSONDecodeError``), as ``json.loads`` does.
    """
    if isinstance(data, bytes) and (encoding := json.detect_encoding(data)) not in ("utf-8", "utf-8-sig"):
        # UTF-16 and UTF-32, which json reads too, are checked as text: a NUL's or a surrogate's
        # escape has a zero byte after each character there, so the byte searches below missed it.
        data = data.decode(encoding, "surrogatepass")
    try:
        value = json.loads(data, parse_constant=_not_a_number, parse_float=_finite_float)
    except RecursionError:
        raise too_deep("The JSON body") from None
    # Cheap pre-check: a body with few brackets cannot nest deeply.
    opened = (
        data.count(b"[") + data.count(b"{") if isinstance(data, bytes) else data.count("[") + data.count("{")
    )
    if opened > MAX_DEPTH:
        path = nesting_path(value)
        if path is not None:
            raise too_deep("The JSON body", path)
    # JSON can only carry a NUL escaped: no escape, no walk.
    if (b"\\u0000" in data) if isinstance(data, bytes) else ("\\u0000" in data):
        path = nul_path(value)
        if path is not None:
            raise has_nul("The JSON body", path)
    if _SURROGATE_IN_BYTES.search(data) if isinstance(data, bytes) else _SURROGATE_IN_TEXT.search(data):
        path = surrogate_path(value)
        if path is not None:
            raise has_surrogate("The JSON body", path)
    return value


def _refuse_nul(request: Request) -> None:
    """422 for a NUL character in a path or query parameter (see ``nul_path``)."""
    for name, value in request.path_params.items():
        if isinstance(value, str) and "\x00" in value:
            raise has_nul(name, ["path", name])
    for name, value in request.query_params.multi_items():
        if "\x00" in name or "\x00" in value:
            raise has_nul(name, ["query", name])


class StrictJSONRequest(Request):
    """A request whose ``json()`` is ``loads``: the one JSON parser of the API's bodies."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


def _declares_json(content_type: str | None) -> bool:
    """Whether FastAPI reads this body as JSON: no content type, application/json or …+json."""
    if not content_type:
        return True
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def _depends_on(dependant: Dependant, call: Callable[..., Any]) -> bool:
    """Whether ``call`` is among the dependencies of ``dependant``, at any depth."""
    return dependant.call is call or any(_depends_on(sub, call) for sub in dependant.dependencies)


class StrictJSONRoute(APIRoute):
    """The route class of every API router: bodies are parsed by ``loads`` before the endpoint runs.

    The body is parsed here, outside FastAPI's body handling (which turns any parser exception into
    a bare 400), so a non-finite number or a too-deep body is a 422 problem+json; FastAPI then reuses
    the parsed value. Malformed JSON is left to FastAPI, which answers it as before (400 invalid_json).
    A route that takes a ``Tenant`` checks the key first (``check_key_before_body``): FastAPI parses
    a body before it solves dependencies, and parsing and checking a hostile body of the size limit
    holds the event loop for seconds, which a caller without a valid key must not get.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        from app.auth.dependencies import check_key_before_body, get_tenant

        handler = super().get_route_handler()
        has_body = self.body_field is not None
        keyed = has_body and _depends_on(self.dependant, get_tenant)

        async def strict_handler(request: Request) -> Response:
            _refuse_nul(request)
            if not has_body:
                return await handler(request)
            if keyed:  # a caller without a valid key gets its 401 before its body is parsed
                await check_key_before_body(request)
            request = StrictJSONRequest(request.scope, request.receive)
            if _declares_json(request.headers.get("content-type")) and await request.body():
                with contextlib.suppress(ValueError):  # malformed: FastAPI parses it again, reports it
                    await request.json()
            return await handler(request)

        return strict_handler
