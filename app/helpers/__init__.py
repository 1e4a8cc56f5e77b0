"""The built-in helpers of the sandbox namespace, by name.

Dotted names (``Search.search``, ``Web.get``) are methods of a namespace object in the sandbox.
Parent-side helpers run in the server (they hold the LLM client and the network); sandbox-side
ones run next to the model's code.
"""

from __future__ import annotations

from app.helpers import (
    binding,
    browser,
    coerce,
    introspection,
    llm_call,
    parallel,
    result,
    sandbox_helpers,
    search,
    subtask,
    web,
)
from app.helpers.base import HelperContext, HelperError, HelperSpec, Usage

HELPERS: dict[str, HelperSpec] = {
    spec.name: spec
    for spec in (
        llm_call.SPEC,
        *binding.SPECS,
        coerce.SPEC,
        subtask.SPEC,
        result.SPEC,
        parallel.SPEC,
        introspection.SPEC,
        search.SPEC,
        *web.SPECS,
        browser.SPEC,
        *sandbox_helpers.SPECS,
    )
}
SERVICE_HELPERS: tuple[str, ...] = tuple(n for n, s in HELPERS.items() if s.runs == "service")

__all__ = ["HELPERS", "SERVICE_HELPERS", "HelperContext", "HelperError", "HelperSpec", "Usage"]
