"""Fixtures of the helper tests: a real web server on loopback, the scripted LLM, a helper context.

The web server serves what the network helpers must handle (an HTML article, a CSV, a PDF made
here, binary content, errors, redirects to private addresses, a huge body, a slow answer) and
records each request with its Host header. A context's persona policy allows 127.0.0.1 (the
only way to reach a loopback server); tests of the default policy build their own.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from app.helpers import HelperContext
from app.helpers.net import FetchLimits
from app.llm import LLMClient, make_llm_client
from app.llm.scripted import ScriptedLLM
from app.personas.models import Network

ARTICLE = """<!doctype html>
<html><head><title>Quantum News</title><script>var tracking = "SECRET_SCRIPT_TEXT";</script></head>
<body>
<nav><a href="/">Home</a> | <a href="/about">About</a></nav>
<article>
<h1>Quantum computing in 2024</h1>
<p>Researchers at Example Lab built a chip with 1,121 qubits, the largest so far.</p>
<p>The team expects error-corrected machines within the decade, according to the lead author.</p>
<table><tr><th>Year</th><th>Qubits</th></tr><tr><td>2023</td><td>433</td></tr>
<tr><td>2024</td><td>1121</td></tr></table>
</article>
<footer>Copyright 2024 Example</footer>
</body></html>
"""
CSV = "month,revenue\nJan,100\nFeb,120\nMar,90\n"
PDF_TEXT = "Hello from a PDF about qubits"
HUGE_SIZE = 1_000_000
SMALL_LIMITS = FetchLimits(max_bytes=200_000, timeout_seconds=5, max_redirects=3)


def make_pdf(text: str) -> bytes:
    """A one-page PDF showing ``text`` in Helvetica, built by hand (objects, xref, trailer)."""
    content = b"BT /F1 18 Tf 72 700 Td (" + text.encode("latin-1") + b") Tj ET"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return out


@dataclass
class Seen:
    """One request the web server received."""

    path: str
    host: str


@dataclass
class WebServer:
    """The loopback web server: ``url(path)`` for its pages, ``seen`` for what it was asked."""

    port: int
    seen: list[Seen] = field(default_factory=list)

    def url(self, path: str, *, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


Route = Callable[[BaseHTTPRequestHandler, WebServer], None]


def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str | None) -> None:
    handler.send_response(status)
    if content_type:
        handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _redirect(location: Callable[[WebServer], str]) -> Route:
    def route(handler: BaseHTTPRequestHandler, server: WebServer) -> None:
        handler.send_response(302)
        handler.send_header("Location", location(server))
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return route


def _static(body: bytes, content_type: str | None, status: int = 200) -> Route:
    return lambda handler, server: _send(handler, status, body, content_type)


def _huge_streamed(handler: BaseHTTPRequestHandler, server: WebServer) -> None:
    """A body with no Content-Length (ends when the connection closes): the cap must count bytes."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain")
    handler.send_header("Connection", "close")
    handler.end_headers()
    chunk = b"x" * 65_536
    for _ in range(HUGE_SIZE // len(chunk) + 1):
        handler.wfile.write(chunk)
    handler.close_connection = True


def _slow(handler: BaseHTTPRequestHandler, server: WebServer) -> None:
    time.sleep(3)
    _send(handler, 200, b"late", "text/plain")


def _spy_page(handler: BaseHTTPRequestHandler, server: WebServer) -> None:
    """A page whose image is on its own host, whose beacon is on ``localhost`` and whose script
    probes the cloud metadata address: what a browser may and may not fetch for it."""
    body = (
        f'<html><body><h1>Spy page</h1><img src="/pixel.png">'
        f'<img src="http://localhost:{server.port}/beacon">'
        f'<script>fetch("http://169.254.169.254/latest/meta-data/").catch(() => 0)</script></body></html>'
    )
    _send(handler, 200, body.encode(), "text/html")


ROUTES: dict[str, Route] = {
    "/article.html": _static(ARTICLE.encode(), "text/html; charset=utf-8"),
    "/data.csv": _static(CSV.encode(), "text/csv"),
    "/export": _static(CSV.encode(), "text/plain"),
    "/weird%20name..csv": _static(CSV.encode(), "application/octet-stream"),
    "/doc.pdf": _static(make_pdf(PDF_TEXT), "application/pdf"),
    "/untyped-pdf": _static(make_pdf(PDF_TEXT), None),
    "/image.png": _static(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "image/png"),
    "/missing": _static(b"not here", "text/plain", status=404),
    "/huge": _static(b"y" * HUGE_SIZE, "text/plain"),
    "/huge-streamed": _huge_streamed,
    "/slow": _slow,
    "/to-article": _redirect(lambda s: "/article.html"),
    "/to-private": _redirect(lambda s: "http://10.0.0.1/admin"),
    "/to-metadata": _redirect(lambda s: "http://169.254.169.254/latest/meta-data/"),
    "/to-file": _redirect(lambda s: "file:///etc/passwd"),
    "/loop": _redirect(lambda s: "/loop"),
    "/latin1.html": _static(
        '<html><head><meta charset="iso-8859-1"></head><body><article><p>Café crème brûlée, the '
        "dessert of the day, is served after six.</p></article></body></html>".encode("latin-1"),
        "text/html",
    ),
    "/spy.html": _spy_page,
    "/pixel.png": _static(b"\x89PNG\r\n\x1a\n", "image/png"),
    "/beacon": _static(b"", "text/plain"),
}


class _QuietServer(ThreadingHTTPServer):
    """Clients hanging up early (the size cap, the timeout) are expected here, not errors."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture(scope="session")
def web() -> Iterator[WebServer]:
    """The web server, on an ephemeral loopback port, for the whole session."""
    state = WebServer(port=0)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            state.seen.append(Seen(path=path, host=self.headers.get("Host", "")))
            route = ROUTES.get(path)
            if route is None:
                _send(self, 404, b"no such page", "text/plain")
            else:
                route(self, state)

    server = _QuietServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture
def scripted() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as llm:
        yield llm


@pytest.fixture
async def llm_client(scripted: ScriptedLLM) -> AsyncIterator[LLMClient]:
    client = make_llm_client(api="chat", base_url=scripted.base_url, api_key=None, retry_base_delay=0.01)
    yield client
    await client.aclose()


@pytest.fixture
def ctx(llm_client: LLMClient, tmp_path: Path) -> HelperContext:
    """A helper context whose persona allows the loopback test server (and nothing private else)."""
    return HelperContext(
        llm=llm_client,
        model="scripted-model",
        workdir=tmp_path,
        network=Network(allow=("127.0.0.1",)),
        fetch_limits=SMALL_LIMITS,
    )
