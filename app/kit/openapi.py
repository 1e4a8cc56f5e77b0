"""The OpenAPI document SDKs are generated from: readable operation ids, and every error response
documented once, from what a route depends on, as problem+json.

Routes name only their domain errors (``problem_responses(404, 409)``); what follows from their
dependencies is added here for every route, including routes added later: an API key (401), the
store (503 ``database_unavailable``), a JSON body (400, 413, 422), parameters (422), ``If-Match``
(an ``ETag`` on the answer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, cast

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.kit.errors import PROBLEM_JSON, WWW_AUTHENTICATE, Problem

PROBLEM_REF: Final = "#/components/schemas/Problem"

ERROR_DESCRIPTIONS: Final[dict[int, str]] = {
    400: "Malformed request: the body is not JSON (`invalid_json`) or a header is malformed (`bad_request`).",
    401: "Missing or invalid API key (`unauthorized`).",
    404: "No such resource for this API key's tenant (`not_found`).",
    409: "Conflicts with the current state (`turn_in_progress`, `awaiting_tool_results`, "
    "`idempotency_in_progress`, …).",
    410: "Gone: the pending tool calls expired (`tool_calls_expired`).",
    412: "`If-Match` names another version; `current.version` is the conversation's (`precondition_failed`).",
    413: "Request body, input or tool output over its limit (`payload_too_large`).",
    422: "The request does not validate; `errors` lists where and why (`validation_error`, …).",
    429: "A tenant limit refused the request before it did anything (`rate_limited`, "
    "`concurrent_turns_limited`, `token_quota_exceeded`); retry after `Retry-After` seconds.",
    502: "The turn failed (`turn_failed`): the model or the service behind it gave up.",
    503: "The store is unreachable (`database_unavailable`); retry after `Retry-After` seconds.",
}

HEADERS: Final[dict[str, dict[str, Any]]] = {
    "WWW-Authenticate": {
        "description": "The scheme to authenticate with: `Bearer`.",
        "schema": {"type": "string"},
        "example": WWW_AUTHENTICATE,
    },
    "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}},
    "ETag": {
        "description": 'The conversation\'s version, quoted (`"3"`): send it back as `If-Match`.',
        "schema": {"type": "string"},
    },
    "Location": {"description": "The URL of the created turn.", "schema": {"type": "string"}},
}
_RESPONSE_HEADERS: Final[dict[int, tuple[str, ...]]] = {
    401: ("WWW-Authenticate",),
    429: ("Retry-After",),
    503: ("Retry-After",),
}


def header(name: str, *, required: bool = False) -> dict[str, dict[str, Any]]:
    """One documented response header (``ETag``, ``Location``…), for a route's ``responses=``."""
    return {name: {**HEADERS[name], "required": required}}


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """A route's domain errors for ``responses=``: each a Problem under ``application/problem+json``."""
    return {code: {"model": Problem, "description": ERROR_DESCRIPTIONS[code]} for code in codes}


def operation_id(route: APIRoute) -> str:
    """``resource.verb`` from the path and method: ``conversations.create``,
    ``conversations.messages.list``, ``conversations.turns.get``. A route's explicit
    ``operation_id`` wins (FastAPI asks this function only for routes without one)."""
    segments = [s for s in route.path_format.strip("/").split("/") if s and s != "v1"]
    resources = [re.sub(r"[^a-z0-9]+", "_", s.lower()) for s in segments if not s.startswith("{")]
    item = bool(segments) and segments[-1].startswith("{")
    method = sorted(route.methods or {"GET"})[0]
    verb = {
        ("GET", False): "list",
        ("GET", True): "get",
        ("POST", False): "create",
        ("POST", True): "create",
        ("PUT", True): "replace",
        ("PATCH", True): "update",
        ("DELETE", True): "delete",
    }.get((method, item), method.lower())
    return ".".join([*(resources or ["root"]), verb])


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    yield dependant
    for sub in dependant.dependencies:
        yield from _dependencies(sub)


def api_routes(app: FastAPI) -> Iterator[APIRoute]:
    """Every API route of the app as it is served (routers' prefixes and dependencies applied)."""
    for context in iter_route_contexts(app.routes):
        if isinstance(context.original_route, APIRoute):
            yield cast(APIRoute, context)


def _implied_errors(route: APIRoute) -> dict[int, str]:
    """The errors a route can answer because of what it depends on (status: description)."""
    from app.auth.dependencies import get_tenant
    from app.kit.db import get_session

    calls = {d.call for d in _dependencies(route.dependant)}
    codes: set[int] = set()
    if get_tenant in calls:
        codes.update((401, 429))  # the key, then the tenant's rate limit
    if get_session in calls:
        codes.add(503)
    flat = list(_dependencies(route.dependant))
    if any(d.body_params for d in flat):
        codes.update((400, 413, 422))
    if any(d.query_params or d.path_params or d.header_params or d.cookie_params for d in flat):
        codes.add(422)
    return {code: ERROR_DESCRIPTIONS[code] for code in codes}


def _problem_content() -> dict[str, Any]:
    return {PROBLEM_JSON: {"schema": {"$ref": PROBLEM_REF}}}


_PROBLEM_SCHEMAS: Final = {
    None,
    "#/components/schemas/Problem",
    "#/components/schemas/HTTPValidationError",  # FastAPI's own 422: our handler answers a Problem
}


def _is_problem(content: dict[str, Any] | None) -> bool:
    """Whether an error response is (or is to be documented as) our Problem: none documented yet,
    FastAPI's placement of a ``model=Problem`` under application/json, or problem+json without a
    schema. A route that documents another error body (an OpenAI-shaped one) keeps it."""
    if not content:
        return True
    refs = {media: (body.get("schema") or {}).get("$ref") for media, body in content.items()}
    return set(refs) <= {"application/json", PROBLEM_JSON} and set(refs.values()) <= _PROBLEM_SCHEMAS


def _honours_if_match(route: APIRoute) -> bool:
    return any(
        (param.alias or param.name).lower() == "if-match"
        for d in _dependencies(route.dependant)
        for param in d.header_params
    )


def document(app: FastAPI, spec: dict[str, Any]) -> dict[str, Any]:
    """Complete a generated spec in place: implied errors, problem+json media types, headers."""
    for route in api_routes(app):
        if not route.include_in_schema:
            continue
        for method in route.methods or ():
            operation = spec["paths"].get(route.path_format, {}).get(method.lower())
            if operation is None:
                continue
            responses: dict[str, Any] = operation["responses"]
            for code, description in _implied_errors(route).items():
                responses.setdefault(str(code), {"description": description})
            if _honours_if_match(route):
                for status, response in responses.items():
                    if status in ("200", "201") and "application/json" in response.get("content", {}):
                        response.setdefault("headers", {}).update(header("ETag"))
    for operations in spec["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                # An optional parameter is one left out (`required: false`); a header or query
                # string cannot be null, so `anyOf [T, null]` only misleads generators.
                schema = parameter.get("schema", {})
                variants = [v for v in schema.get("anyOf", []) if v != {"type": "null"}]
                if len(variants) == 1 and len(schema["anyOf"]) == 2:
                    del schema["anyOf"]
                    schema.update(variants[0])
            for status, response in operation["responses"].items():
                if not status.isdigit() or int(status) < 400:
                    continue
                if _is_problem(response.get("content")):
                    response["content"] = _problem_content()
                for name in _RESPONSE_HEADERS.get(int(status), ()):
                    response.setdefault("headers", {}).update(header(name, required=status == "401"))
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    if "Problem" not in schemas:
        schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    for unused in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422 body, replaced above
        if f'#/components/schemas/{unused}"' not in json.dumps(spec):
            schemas.pop(unused, None)
    return spec


def add_component_schemas(spec: dict[str, Any], models: Sequence[type[BaseModel]]) -> None:
    """Document models that no route's body or answer names but a stream's events carry (a streamed
    chat completion's chunks) under ``components/schemas``, for ``$ref``s and generators. A name
    that is already taken by another schema is a programming error."""
    if not models:
        return
    _, top = models_json_schema(
        [(model, "serialization") for model in models], ref_template="#/components/schemas/{model}"
    )
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in top.get("$defs", {}).items():
        if schemas.setdefault(name, schema) != schema:
            raise ValueError(f"two schemas are named {name!r} in the OpenAPI document")


def install_openapi(
    app: FastAPI, *, servers: list[dict[str, Any]], models: Sequence[type[BaseModel]] = ()
) -> None:
    """Serve the completed spec (built once, then cached like FastAPI's own); ``models`` are
    documented too (see ``add_component_schemas``)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
                servers=servers,
                tags=app.openapi_tags,
                separate_input_output_schemas=app.separate_input_output_schemas,
            )
            add_component_schemas(spec, models)
            app.openapi_schema = document(app, spec)
        return app.openapi_schema

    replace: Callable[[], dict[str, Any]] = openapi
    app.openapi = replace  # type: ignore[method-assign]
