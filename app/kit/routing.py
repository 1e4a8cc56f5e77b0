"""The API's routers: built once per process, their routes shared by every app built from them.

FastAPI 0.165 builds an included router's routes lazily for each app (dependency analysis and
response-model adapters, about 70 ms of CPU on the app's first request): a cost each ``sabre serve``
worker paid on its first request, and each of the test suite's thousand apps. Routes defined on a
router configured with what an include would have added (route class, operation ids) are complete
at import, so an app takes them as they are (``add_routes``); the committed OpenAPI spec
(``tests/test_openapi.py``) checks the result is the same API.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from app.kit.json_body import StrictJSONRoute
from app.kit.openapi import operation_id


def api_router(*, prefix: str, tags: list[str]) -> APIRouter:
    """A domain's router: strict JSON bodies, ``resource.verb`` operation ids."""
    return APIRouter(
        prefix=prefix,
        tags=list(tags),
        route_class=StrictJSONRoute,
        generate_unique_id_function=operation_id,
    )


def add_routes(app: FastAPI, *routers: APIRouter) -> None:
    """Serve the routers' routes on ``app`` in order, the route objects themselves (not rebuilt
    per app, as ``include_router`` does). They do not see ``app.dependency_overrides``: nothing
    here uses it."""
    for router in routers:
        app.router.routes.extend(router.routes)
