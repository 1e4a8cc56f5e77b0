"""Every helper of this library is registered, documented, and no longer pending for personas."""

from __future__ import annotations

import ast

import pytest

from app.helpers import HELPERS, SERVICE_HELPERS, HelperContext
from app.helpers.introspection import helpers
from app.personas.loader import PENDING_HELPERS

NAMES = (
    "Search.search",
    "Web.get",
    "Web.download_csv",
    "download",
    "Browser.screenshot",
    "llm_bind",
    "llm_list_bind",
    "coerce",
    "sabre_call",
)


@pytest.mark.parametrize("name", NAMES)
def test_registered_documented_and_not_pending(name: str) -> None:
    spec = HELPERS[name]
    assert spec.runs == "service"
    assert spec.handler is not None
    assert name in SERVICE_HELPERS
    assert name not in PENDING_HELPERS
    assert spec.signature.startswith(f"{name}(")
    ast.parse(f"def _{spec.signature[spec.signature.index('(') :]}: pass")
    assert "Example" in spec.doc
    assert "return" in spec.doc.lower()


async def test_helpers_search_finds_them(ctx: HelperContext) -> None:
    found = await helpers(ctx, ["csv"], {})
    assert "### Web.download_csv(url: str) -> str" in found
    listing = await helpers(ctx, [], {})
    for name in NAMES:
        assert f"\n{name}(" in f"\n{listing}"
