"""Web.get, Web.download_csv and download against the loopback web server."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace

import pandas as pd
import pytest

from app.helpers import HelperContext, HelperError
from app.helpers.web import download, web_download_csv, web_get
from app.personas.models import Network
from tests.helpers.conftest import CSV, PDF_TEXT, WebServer


async def test_get_turns_html_into_readable_text(ctx: HelperContext, web: WebServer) -> None:
    text = await web_get(ctx, [web.url("/article.html")], {})
    assert "Quantum computing in 2024" in text
    assert "1,121 qubits" in text
    assert "| 2024 | 1121 |" in text  # tables survive as Markdown
    assert "<p>" not in text
    assert "SECRET_SCRIPT_TEXT" not in text


async def test_get_follows_redirects_and_reads_pdf_and_csv(ctx: HelperContext, web: WebServer) -> None:
    assert "1,121 qubits" in await web_get(ctx, [web.url("/to-article")], {})
    assert PDF_TEXT in await web_get(ctx, [], {"url": web.url("/doc.pdf")})
    assert PDF_TEXT in await web_get(ctx, [web.url("/untyped-pdf")], {})
    assert await web_get(ctx, [web.url("/data.csv")], {}) == CSV


async def test_get_reads_the_charset_a_page_declares_in_its_html(ctx: HelperContext, web: WebServer) -> None:
    assert "Café crème brûlée" in await web_get(ctx, [web.url("/latin1.html")], {})


async def test_get_caps_the_text(ctx: HelperContext, web: WebServer) -> None:
    text = await web_get(ctx, [web.url("/data.csv")], {"max_chars": 10})
    assert text.startswith(CSV[:10])
    assert f"[... truncated: {len(CSV) - 10:,} more characters]" in text


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/image.png", "image/png, not a page"),
        ("/missing", "HTTP 404"),
        ("/to-private", "private, loopback or reserved"),
        ("/huge", "over the limit of 200,000 bytes"),
    ],
)
async def test_get_errors(ctx: HelperContext, web: WebServer, path: str, error: str) -> None:
    with pytest.raises(HelperError, match=f"^Web.get: .*{error}"):
        await web_get(ctx, [web.url(path)], {})


async def test_get_bad_calls(ctx: HelperContext) -> None:
    with pytest.raises(HelperError, match="missing required argument 'url'"):
        await web_get(ctx, [], {})
    with pytest.raises(HelperError, match="unexpected argument 'timeout'"):
        await web_get(ctx, ["http://x"], {"timeout": 3})
    with pytest.raises(HelperError, match="expected a URL string"):
        await web_get(ctx, [["http://x"]], {})
    with pytest.raises(HelperError, match="max_chars"):
        await web_get(ctx, ["http://x"], {"max_chars": 0})


async def test_get_refuses_the_loopback_server_without_an_explicit_allow(
    ctx: HelperContext, web: WebServer
) -> None:
    for network in (None, Network(allow=("*",)), Network(allow=("localhost",))):
        with pytest.raises(HelperError, match="private, loopback or reserved"):
            await web_get(replace(ctx, network=network), [web.url("/article.html", host="localhost")], {})


async def test_download_csv_writes_a_new_file_pandas_reads(ctx: HelperContext, web: WebServer) -> None:
    assert ctx.workdir is not None
    first = await web_download_csv(ctx, [web.url("/data.csv")], {})
    second = await web_download_csv(ctx, [web.url("/data.csv")], {})
    assert (first, second) == ("data.csv", "data-2.csv")
    frame = pd.read_csv(ctx.workdir / first)
    assert list(frame.columns) == ["month", "revenue"]
    assert frame["revenue"].sum() == 310
    assert (ctx.workdir / second).read_text() == CSV


async def test_download_csv_names_are_safe(ctx: HelperContext, web: WebServer) -> None:
    assert await web_download_csv(ctx, [web.url("/weird%20name..csv?x=../../etc")], {}) == "weird-name.csv"
    assert await web_download_csv(ctx, [web.url("/export")], {}) == "export.csv"


async def test_download_csv_never_follows_a_planted_symlink(
    ctx: HelperContext, web: WebServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert ctx.workdir is not None
    outside = tmp_path_factory.mktemp("outside") / "target.txt"
    outside.write_text("untouched")
    os.symlink(outside, ctx.workdir / "data.csv")
    assert await web_download_csv(ctx, [web.url("/data.csv")], {}) == "data-2.csv"
    assert outside.read_text() == "untouched"


async def test_download_csv_errors(ctx: HelperContext, web: WebServer) -> None:
    with pytest.raises(HelperError, match="returned text/html, not CSV"):
        await web_download_csv(ctx, [web.url("/article.html")], {})
    with pytest.raises(HelperError, match="not CSV"):
        await web_download_csv(ctx, [web.url("/doc.pdf")], {})
    with pytest.raises(HelperError, match=r"Web.download_csv: .*private"):
        await web_download_csv(ctx, ["http://10.0.0.1/data.csv"], {})
    with pytest.raises(HelperError, match="no working directory"):
        await web_download_csv(replace(ctx, workdir=None), [web.url("/data.csv")], {})


async def test_download_mixes_pages_pdfs_csvs_and_failures(ctx: HelperContext, web: WebServer) -> None:
    results = [
        {"title": "Quantum News", "url": web.url("/article.html"), "snippet": "..."},
        {"title": "A PDF", "url": web.url("/doc.pdf"), "snippet": "..."},
    ]
    items = await download(
        ctx,
        [[*results, web.url("/data.csv"), web.url("/missing"), "http://169.254.169.254/", "ftp://x/y", 7]],
        {},
    )
    assert [item["url"] for item in items] == [
        web.url("/article.html"),
        web.url("/doc.pdf"),
        web.url("/data.csv"),
        web.url("/missing"),
        "http://169.254.169.254/",
        "ftp://x/y",
        "7",
    ]
    page, pdf, csv, missing, metadata, ftp, number = items
    assert page["title"] == "Quantum News"
    assert page["content_type"] == "text/html"
    assert "1,121 qubits" in page["text"]
    assert "error" not in page
    assert pdf["content_type"] == "application/pdf"
    assert PDF_TEXT in pdf["text"]
    assert csv == {"url": web.url("/data.csv"), "content_type": "text/csv", "text": CSV}
    assert "HTTP 404" in missing["error"]
    assert missing["text"] == ""
    assert "private" in metadata["error"]
    assert "only http and https" in ftp["error"]
    assert "expected a URL string" in number["error"]


async def test_download_accepts_one_url_and_caps_each_text(ctx: HelperContext, web: WebServer) -> None:
    [item] = await download(ctx, [web.url("/data.csv")], {"max_chars": 5})
    assert item["text"].startswith("month\n\n[... truncated")
    assert await download(ctx, [[]], {}) == []


async def test_download_limits(ctx: HelperContext) -> None:
    with pytest.raises(HelperError, match="21 URLs in one call, the limit is 20"):
        await download(ctx, [[f"http://example.com/{i}" for i in range(21)]], {})
    with pytest.raises(HelperError, match="missing required argument 'urls'"):
        await download(ctx, [], {})


async def test_workdir_holds_only_what_was_downloaded(ctx: HelperContext, web: WebServer) -> None:
    assert ctx.workdir is not None
    await download(ctx, [web.url("/data.csv")], {})
    await web_get(ctx, [web.url("/data.csv")], {})
    assert await asyncio.to_thread(os.listdir, ctx.workdir) == []
