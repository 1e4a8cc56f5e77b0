"""The built-in helpers of the sandbox namespace, by name."""

from __future__ import annotations

from app.helpers import introspection, llm_call, result
from app.helpers.base import HelperContext, HelperError, HelperSpec, Usage

HELPERS: dict[str, HelperSpec] = {
    spec.name: spec for spec in (llm_call.SPEC, result.SPEC, introspection.SPEC)
}
PARENT_HELPERS: tuple[str, ...] = tuple(n for n, s in HELPERS.items() if s.runs == "parent")

__all__ = ["HELPERS", "PARENT_HELPERS", "HelperContext", "HelperError", "HelperSpec", "Usage"]
