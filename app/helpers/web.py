"""``Web.get``, ``Web.download_csv`` and ``download``: web pages, PDFs and CSVs as text or files.

Everything goes through ``app.helpers.net`` (the persona's network policy, size and time caps).
Pages become readable text (the main content as Markdown, via trafilatura, not raw HTML), PDFs
their text (pypdf), CSV and other text as it is; each is capped in characters so one page cannot
flood the model's context. Parsing is CPU work, so it runs in a thread, off the server's event loop;
the parsing libraries are imported on first use, not when the server starts.
"""

from __future__ import annotations

import asyncio
import functools
import io
from typing import Any, Final, Literal

from app.helpers.base import HelperContext, HelperError, HelperSpec, bind_arguments
from app.helpers.files import safe_stem, workdir_of, write_new_file
from app.helpers.net import Fetched, FetchError, NetworkPolicy, default_limits, fetch, parse_url
from app.helpers.threads import run_blocking

Kind = Literal["html", "pdf", "csv", "text", "binary"]

GET_MAX_CHARS: Final = 100_000
DOWNLOAD_MAX_CHARS: Final = 50_000
HARD_MAX_CHARS: Final = 1_000_000
MAX_URLS: Final = 20
CONCURRENCY: Final = 4

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_PDF_TYPES = frozenset({"application/pdf", "application/x-pdf"})
_CSV_TYPES = frozenset(
    {"text/csv", "application/csv", "text/comma-separated-values", "text/tab-separated-values"}
)
_TEXT_TYPES = frozenset(
    {"application/json", "application/xml", "application/javascript", "application/x-ndjson"}
)
_UNTYPED = frozenset({"", "application/octet-stream", "binary/octet-stream", "text/plain"})
_CANONICAL: dict[Kind, str] = {
    "html": "text/html",
    "pdf": "application/pdf",
    "csv": "text/csv",
    "text": "text/plain",
}


def kind_of(page: Fetched) -> Kind:
    """What the response is: the declared type, or a look at the bytes when the server is vague."""
    declared = page.content_type
    head = page.body[:1024]
    if declared in _PDF_TYPES or head.startswith(b"%PDF-"):
        return "pdf"
    if declared in _HTML_TYPES:
        return "html"
    path = page.url.split("?", 1)[0].split("#", 1)[0].lower()
    if declared in _CSV_TYPES or (declared in _UNTYPED and path.endswith((".csv", ".tsv"))):
        return "csv"
    if declared in _UNTYPED:
        start = head.lstrip().lower()
        if start.startswith((b"<!doctype html", b"<html")):
            return "html"
        return "binary" if b"\x00" in head else "text"
    if declared.startswith("text/") or declared in _TEXT_TYPES or declared.endswith(("+json", "+xml")):
        return "text"
    return "binary"


def _cap(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars``, saying how much was left out."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n\n[... truncated: {len(text) - max_chars:,} more characters]"


def html_to_text(html: str | bytes, *, url: str | None = None) -> str:
    """The readable content of a page as Markdown (main text, headings, tables; no menus or scripts),
    or all of its visible text when no main content stands out."""
    import trafilatura

    text = trafilatura.extract(
        html,
        url=url,
        output_format="markdown",
        include_tables=True,
        include_comments=False,
        include_links=False,
        favor_recall=True,
        with_metadata=False,
    )
    if not text:
        text = trafilatura.html2txt(html)
    return (text or "").strip()


def pdf_to_text(data: bytes) -> str:
    """The text of every page of a PDF, pages separated by a blank line."""
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise HelperError("the PDF is encrypted")
        pages = [page.extract_text() or "" for page in reader.pages]
    except HelperError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        raise HelperError(f"cannot read the PDF: {exc}") from None
    except Exception as exc:  # pypdf raises many types on malformed files; none may kill the call
        raise HelperError(f"cannot read the PDF: {type(exc).__name__}: {exc}") from None
    return "\n\n".join(p.strip() for p in pages if p.strip())


async def document_text(page: Fetched, *, max_chars: int) -> tuple[str, str]:
    """``(content_type, text)`` of a fetched document; binary content is a HelperError."""
    kind = kind_of(page)
    content_type = page.content_type if page.content_type not in _UNTYPED else _CANONICAL.get(kind, "")
    if kind == "binary":
        raise HelperError(
            f"{page.url} is {page.content_type or 'binary content'}, not a page, PDF or text "
            f"(Browser.screenshot(url) captures what a page looks like)"
        )
    if kind == "html":
        # Undeclared charsets are left to the extractor, which reads <meta charset> itself.
        html = page.text() if page.charset else page.body
        try:
            text = await run_blocking(functools.partial(html_to_text, html, url=page.url))
        except Exception as exc:  # a parser failure on one hostile page must not kill the call
            raise HelperError(f"cannot read the page {page.url}: {type(exc).__name__}: {exc}") from None
    elif kind == "pdf":
        text = await run_blocking(pdf_to_text, page.body)
    else:
        text = page.text()
    return content_type, _cap(text, max_chars)


async def _get(ctx: HelperContext, url: Any) -> Fetched:
    """Fetch ``url`` under the context's network policy and limits."""
    return await fetch(
        url, policy=NetworkPolicy.from_network(ctx.network), limits=ctx.fetch_limits or default_limits()
    )


def _max_chars(value: Any, *, helper: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= HARD_MAX_CHARS:
        raise HelperError(f"{helper}: max_chars must be an integer from 1 to {HARD_MAX_CHARS:,}")
    return value


# -- Web.get --------------------------------------------------------------------------------------

GET_USAGE = "Web.get(url, *, max_chars=100000)"


async def web_get(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> str:
    """The readable text of one page (or PDF, or text file); errors raise."""
    params = bind_arguments(
        GET_USAGE, args, kwargs, positional=("url",), keyword_only={"max_chars": GET_MAX_CHARS}
    )
    max_chars = _max_chars(params["max_chars"], helper="Web.get")
    try:
        page = await _get(ctx, params["url"])
        _, text = await document_text(page, max_chars=max_chars)
    except HelperError as exc:
        raise HelperError(f"Web.get: {exc}") from None
    return text


GET_SPEC = HelperSpec(
    name="Web.get",
    signature="Web.get(url: str, *, max_chars: int = 100000) -> str",
    doc="""
Fetch one web page and return its readable text: the main content as Markdown (headings,
paragraphs, tables; no menus, ads or scripts). PDFs come back as their text, CSV/JSON/plain text
as they are. Longer text is cut at `max_chars` with a note saying how much was left out.
Raises an error for HTTP errors, binary content (images, archives), responses over the size cap,
and addresses the network policy refuses (private and internal addresses always are).
Example:
    text = Web.get("https://en.wikipedia.org/wiki/Python_(programming_language)")
    summary = llm_call(text, "Who created Python, and when?")
""",
    runs="service",
    handler=web_get,
)


# -- Web.download_csv -----------------------------------------------------------------------------

CSV_USAGE = "Web.download_csv(url)"


async def web_download_csv(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> str:
    """Save the CSV at ``url`` into the working directory; returns its path relative to it."""
    params = bind_arguments(CSV_USAGE, args, kwargs, positional=("url",))
    workdir = workdir_of(ctx, helper="Web.download_csv")
    try:
        page = await _get(ctx, params["url"])
    except HelperError as exc:
        raise HelperError(f"Web.download_csv: {exc}") from None
    kind = kind_of(page)
    if not (kind == "csv" or (kind == "text" and page.content_type in _UNTYPED)):
        raise HelperError(
            f"Web.download_csv: {page.url} returned {page.content_type or kind}, not CSV "
            f"(use Web.get(url) to read a page and find the data link in it)"
        )
    if not page.body.strip():
        raise HelperError(f"Web.download_csv: {page.url} returned an empty file")
    path = parse_url(page.url).path
    suffix = ".tsv" if path.lower().endswith(".tsv") else ".csv"
    return await write_new_file(
        workdir, stem=safe_stem(path, default="download"), suffix=suffix, data=page.body
    )


DOWNLOAD_CSV_SPEC = HelperSpec(
    name="Web.download_csv",
    signature="Web.download_csv(url: str) -> str",
    doc="""
Download a CSV file into the working directory and return its path (relative, ready for
`pd.read_csv`). The file is named after the URL (`data.csv`, then `data-2.csv`, ... : an existing
file is never overwritten). Raises an error when the URL returns an HTML page or binary content
instead of CSV text, and for the same network failures as `Web.get`.
Example:
    csv_path = Web.download_csv("https://example.com/data/sales.csv")
    df = pd.read_csv(csv_path)
    print(df.shape, list(df.columns))
""",
    runs="service",
    handler=web_download_csv,
)


# -- download -------------------------------------------------------------------------------------

DOWNLOAD_USAGE = "download(urls, *, max_chars=50000)"


def _targets(urls: Any) -> list[tuple[Any, str | None]]:
    """``(url, title)`` pairs from a URL, a list of URLs, or search results (dicts with ``url``)."""
    items = urls if isinstance(urls, list) else [urls]
    targets: list[tuple[Any, str | None]] = []
    for item in items:
        if isinstance(item, dict):
            url = item.get("url", item.get("href"))
            title = item.get("title")
            targets.append((url, title if isinstance(title, str) else None))
        else:
            targets.append((item, None))
    return targets


async def _download_one(ctx: HelperContext, url: Any, title: str | None, *, max_chars: int) -> dict[str, Any]:
    item: dict[str, Any] = {"url": url if isinstance(url, str) else repr(url)}
    if title:
        item["title"] = title
    try:
        page = await _get(ctx, url)
        content_type, text = await document_text(page, max_chars=max_chars)
    except HelperError as exc:
        return {**item, "content_type": None, "text": "", "error": str(exc)}
    return {**item, "content_type": content_type, "text": text}


async def download(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """Fetch several URLs concurrently; each item reports its own text or error."""
    params = bind_arguments(
        DOWNLOAD_USAGE, args, kwargs, positional=("urls",), keyword_only={"max_chars": DOWNLOAD_MAX_CHARS}
    )
    max_chars = _max_chars(params["max_chars"], helper="download")
    targets = _targets(params["urls"])
    if not targets:
        return []
    if len(targets) > MAX_URLS:
        raise HelperError(f"download: {len(targets)} URLs in one call, the limit is {MAX_URLS}")
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(url: Any, title: str | None) -> dict[str, Any]:
        async with gate:
            return await _download_one(ctx, url, title, max_chars=max_chars)

    return list(await asyncio.gather(*(one(url, title) for url, title in targets)))


DOWNLOAD_SPEC = HelperSpec(
    name="download",
    signature="download(urls: str | list[str] | list[dict], *, max_chars: int = 50000) -> list[dict]",
    doc="""
Download web pages, PDFs and CSV files, several at once, and return their text: one dict per URL,
in order, `{"url", "content_type", "text"}` (plus `"title"` when you passed search results).
`urls` is a URL, a list of URLs, or results of `Search.search` (dicts with a `"url"`). Pages
become their readable text (Markdown), PDFs their text, CSVs their text; each text is cut at
`max_chars`. A URL that fails does not fail the call: its item has `"error"` (the reason) and an
empty `"text"`. At most 20 URLs per call.
Example:
    results = Search.search("James Webb telescope discoveries 2024", num_results=5)
    pages = download(results[:3])
    ok = [p for p in pages if not p.get("error")]
    answer = llm_call(ok, "List the main discoveries, citing each page's url")
""",
    runs="service",
    handler=download,
)

SPECS: tuple[HelperSpec, ...] = (GET_SPEC, DOWNLOAD_CSV_SPEC, DOWNLOAD_SPEC)

__all__ = [
    "SPECS",
    "FetchError",
    "document_text",
    "download",
    "html_to_text",
    "kind_of",
    "pdf_to_text",
    "web_download_csv",
    "web_get",
]
