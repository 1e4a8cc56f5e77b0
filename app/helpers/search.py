"""``Search.search(query, num_results)``: web search behind a small backend interface.

The default backend is the ``ddgs`` metasearch library; another one is configured with
``SABRE_SEARCH_BACKEND=package.module:attribute``, where the attribute is a class or factory that
takes no arguments and returns a ``SearchBackend``. Queries go to the search service the operator
chose (not to model-chosen addresses), so the per-URL network policy does not apply to them; a
persona whose policy denies everything (``deny: ["*"]``) cannot search either.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
from typing import Any, Final, Protocol, TypedDict, runtime_checkable

from app.helpers.base import HelperContext, HelperError, HelperSpec, bind_arguments
from app.helpers.net import NetworkPolicy
from app.helpers.threads import run_blocking

MAX_RESULTS: Final = 50
DDGS_TIMEOUT_SECONDS: Final = 10


class SearchResult(TypedDict):
    """One hit: what the page is called, where it is, and the search engine's extract of it."""

    title: str
    url: str
    snippet: str


class SearchBackendError(Exception):
    """The search service failed; the message is shown to the model."""


@runtime_checkable
class SearchBackend(Protocol):
    """A web search service."""

    async def search(self, query: str, *, num_results: int) -> list[SearchResult]:
        """Up to ``num_results`` hits for ``query``, best first; SearchBackendError on failure."""
        ...


class DdgsBackend:
    """Search through ``ddgs`` (DuckDuckGo and other engines it aggregates)."""

    def __init__(
        self,
        *,
        backend: str = "auto",
        region: str = "us-en",
        safesearch: str = "moderate",
        timeout: int = DDGS_TIMEOUT_SECONDS,
    ) -> None:
        self.backend = backend
        self.region = region
        self.safesearch = safesearch
        self.timeout = timeout

    async def search(self, query: str, *, num_results: int) -> list[SearchResult]:
        """Run the library's blocking search in a thread, bounded in time."""
        try:
            async with asyncio.timeout(self.timeout * 3):
                raw = await run_blocking(self._search, query, num_results)
        except TimeoutError:
            raise SearchBackendError("the search service did not answer in time") from None
        results: list[SearchResult] = []
        for hit in raw:
            url = hit.get("href") or hit.get("url")
            if isinstance(url, str) and url:
                results.append(
                    SearchResult(
                        title=str(hit.get("title") or ""),
                        url=url,
                        snippet=str(hit.get("body") or hit.get("snippet") or ""),
                    )
                )
        return results[:num_results]

    def _search(self, query: str, num_results: int) -> list[dict[str, Any]]:
        from ddgs import DDGS
        from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException

        try:
            return DDGS(timeout=self.timeout).text(
                query,
                max_results=num_results,
                region=self.region,
                safesearch=self.safesearch,
                backend=self.backend,
            )
        except RatelimitException:
            raise SearchBackendError("the search service is rate-limiting us; try again later") from None
        except TimeoutException:
            raise SearchBackendError("the search service did not answer in time") from None
        except DDGSException as exc:
            if str(exc) == "No results found.":
                return []
            raise SearchBackendError(f"the search failed: {exc}") from None


def load_backend(spec: str) -> SearchBackend:
    """The backend named by ``spec``: ``ddgs``, or ``package.module:attribute`` (a no-argument factory)."""
    if spec.strip().lower() == "ddgs":
        return DdgsBackend()
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"SABRE_SEARCH_BACKEND={spec!r}: expected 'ddgs' or 'package.module:attribute'")
    factory = getattr(importlib.import_module(module_name), attribute)
    backend = factory()
    if not isinstance(backend, SearchBackend):
        raise ValueError(f"SABRE_SEARCH_BACKEND={spec!r} did not build a SearchBackend (no async search())")
    return backend


@functools.cache
def configured_backend() -> SearchBackend:
    """The backend ``SABRE_SEARCH_BACKEND`` names, built once."""
    from app.config import Settings

    return load_backend(Settings().search_backend)


USAGE = "Search.search(query, num_results=10)"


async def search(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> list[SearchResult]:
    """Search the web; returns ``[{title, url, snippet}, ...]``."""
    params = bind_arguments(
        USAGE, args, kwargs, positional=("query", "num_results"), defaults={"num_results": 10}
    )
    query, num_results = params["query"], params["num_results"]
    if not isinstance(query, str) or not query.strip():
        raise HelperError("Search.search: query must be a non-empty string")
    if isinstance(num_results, bool) or not isinstance(num_results, int) or num_results < 1:
        raise HelperError("Search.search: num_results must be a positive integer")
    if NetworkPolicy.from_network(ctx.network).blocks_everything:
        raise HelperError("Search.search: this persona's network policy denies all network access")
    try:
        return await configured_backend().search(query.strip(), num_results=min(num_results, MAX_RESULTS))
    except SearchBackendError as exc:
        raise HelperError(f"Search.search: {exc}") from None
    except Exception as exc:  # a backend's own failure (library, plug-in) is the search failing
        raise HelperError(f"Search.search: the search failed: {type(exc).__name__}: {exc}") from None


SPEC = HelperSpec(
    name="Search.search",
    signature="Search.search(query: str, num_results: int = 10) -> list[dict]",
    doc="""
Search the web. Returns up to `num_results` hits (at most 50), best first, each a dict
`{"title": str, "url": str, "snippet": str}`: the snippet is the search engine's short extract,
not the page; pass the results (or their urls) to `download` to read the pages themselves.
An empty list means nothing was found; a failing search service raises an error.
Example:
    results = Search.search("python 3.13 release notes", num_results=5)
    for r in results:
        print(r["title"], r["url"])
    pages = download(results[:2])
""",
    runs="service",
    handler=search,
)
