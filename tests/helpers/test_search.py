"""Search.search over the real ddgs library, its network call stubbed at the library's boundary."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import ddgs.ddgs
import pytest
from ddgs.exceptions import DDGSException, RatelimitException

from app.helpers import HelperContext, HelperError
from app.helpers.search import (
    DdgsBackend,
    SearchResult,
    configured_backend,
    load_backend,
    search,
)
from app.personas.models import Network


class FakeBackend:
    """A backend of the operator's own, loaded by ``SABRE_SEARCH_BACKEND=module:attribute``."""

    async def search(self, query: str, *, num_results: int) -> list[SearchResult]:
        return [
            SearchResult(title=f"{query} {i}", url=f"https://fake.test/{i}", snippet="")
            for i in range(num_results)
        ]


class NotABackend:
    pass


class BrokenBackend:
    async def search(self, query: str, *, num_results: int) -> list[SearchResult]:
        raise RuntimeError("plug-in bug")


@pytest.fixture
def ddgs_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """``DDGS.text`` answers from a canned list (the HTTP requests to the engines are never made)."""
    calls: list[dict[str, Any]] = []

    def text(self: Any, query: str, **kwargs: Any) -> list[dict[str, Any]]:
        calls.append({"query": query, **kwargs})
        hits = [
            {"title": f"Result {i}", "href": f"https://example.com/{i}", "body": f"About {query} {i}"}
            for i in range(kwargs["max_results"] + 2)  # the library may return more than asked
        ]
        return [*hits[:1], {"title": "no url", "href": "", "body": ""}, *hits[1:]]

    monkeypatch.setattr(ddgs.ddgs.DDGS, "text", text)
    monkeypatch.delenv("SABRE_SEARCH_BACKEND", raising=False)
    configured_backend.cache_clear()
    yield calls
    configured_backend.cache_clear()


async def test_search_returns_title_url_snippet(ctx: HelperContext, ddgs_calls: list[dict[str, Any]]) -> None:
    results = await search(ctx, ["  quantum computing 2024 "], {"num_results": 3})
    assert results == [
        {
            "title": f"Result {i}",
            "url": f"https://example.com/{i}",
            "snippet": f"About quantum computing 2024 {i}",
        }
        for i in range(3)
    ]
    assert ddgs_calls == [
        {
            "query": "quantum computing 2024",
            "max_results": 3,
            "region": "us-en",
            "safesearch": "moderate",
            "backend": "auto",
        }
    ]
    assert isinstance(configured_backend(), DdgsBackend)


async def test_search_defaults_to_ten_and_caps_at_fifty(
    ctx: HelperContext, ddgs_calls: list[dict[str, Any]]
) -> None:
    assert len(await search(ctx, ["q"], {})) == 10
    assert len(await search(ctx, ["q", 500], {})) == 50
    assert [c["max_results"] for c in ddgs_calls] == [10, 50]


async def test_no_results_is_an_empty_list(ctx: HelperContext, monkeypatch: pytest.MonkeyPatch) -> None:
    def nothing(self: Any, query: str, **kwargs: Any) -> list[dict[str, Any]]:
        raise DDGSException("No results found.")

    monkeypatch.setattr(ddgs.ddgs.DDGS, "text", nothing)
    configured_backend.cache_clear()
    assert await search(ctx, ["zzzz"], {}) == []


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (RatelimitException("429"), "rate-limiting"),
        (DDGSException("engine exploded"), "the search failed: engine exploded"),
    ],
)
async def test_search_service_failures_are_helper_errors(
    ctx: HelperContext, monkeypatch: pytest.MonkeyPatch, error: Exception, message: str
) -> None:
    def failing(self: Any, query: str, **kwargs: Any) -> list[dict[str, Any]]:
        raise error

    monkeypatch.setattr(ddgs.ddgs.DDGS, "text", failing)
    configured_backend.cache_clear()
    with pytest.raises(HelperError, match=f"Search.search: .*{message}"):
        await search(ctx, ["q"], {})


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ([], {}, "missing required argument 'query'"),
        ([""], {}, "query must be a non-empty string"),
        ([["q"]], {}, "query must be a non-empty string"),
        (["q", 0], {}, "num_results must be a positive integer"),
        (["q", True], {}, "num_results must be a positive integer"),
        (["q"], {"limit": 3}, "unexpected argument 'limit'"),
        (["q", 3, 4], {}, "too many positional arguments"),
    ],
)
async def test_bad_calls(
    ctx: HelperContext,
    ddgs_calls: list[dict[str, Any]],
    args: list[Any],
    kwargs: dict[str, Any],
    message: str,
) -> None:
    with pytest.raises(HelperError, match=message):
        await search(ctx, args, kwargs)
    assert ddgs_calls == []


async def test_a_persona_denying_everything_cannot_search(
    ctx: HelperContext, ddgs_calls: list[dict[str, Any]]
) -> None:
    with pytest.raises(HelperError, match="denies all network access"):
        await search(replace(ctx, network=Network(deny=("*",))), ["q"], {})
    assert ddgs_calls == []


async def test_another_backend_is_configured_by_setting(
    ctx: HelperContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SABRE_SEARCH_BACKEND", "tests.helpers.test_search:FakeBackend")
    configured_backend.cache_clear()
    try:
        assert await search(ctx, ["cats", 2], {}) == [
            {"title": "cats 0", "url": "https://fake.test/0", "snippet": ""},
            {"title": "cats 1", "url": "https://fake.test/1", "snippet": ""},
        ]
    finally:
        configured_backend.cache_clear()


async def test_a_failing_backend_is_a_helper_error(
    ctx: HelperContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SABRE_SEARCH_BACKEND", "tests.helpers.test_search:BrokenBackend")
    configured_backend.cache_clear()
    try:
        with pytest.raises(HelperError, match="the search failed: RuntimeError: plug-in bug"):
            await search(ctx, ["q"], {})
    finally:
        configured_backend.cache_clear()


def test_backend_specs() -> None:
    assert isinstance(load_backend("ddgs"), DdgsBackend)
    assert isinstance(load_backend("tests.helpers.test_search:FakeBackend"), FakeBackend)
    with pytest.raises(ValueError, match=r"expected 'ddgs' or 'package.module:attribute'"):
        load_backend("bing")
    with pytest.raises(ValueError, match="did not build a SearchBackend"):
        load_backend("tests.helpers.test_search:NotABackend")
