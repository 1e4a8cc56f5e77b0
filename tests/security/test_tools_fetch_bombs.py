"""Compressed responses a fetching helper reads: decoded only up to the size cap.

A web page is whatever the model's code points ``Web.get`` or ``download`` at, so its server is
hostile. httpx inflates each received chunk whole before anything is counted: 824 bytes of
``Content-Encoding: gzip, gzip`` (or 13 KB of ``zstd``) became 400 MB in the server's memory for a
fetch capped at 200 KB; a few kilobytes more and the process every tenant shares runs out of memory.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import random
import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from app.helpers.net import FetchError, FetchLimits, NetworkPolicy, fetch
from app.personas.models import Network

LIMITS = FetchLimits(max_bytes=200_000, timeout_seconds=20, max_redirects=1)
LOOPBACK = NetworkPolicy.from_network(Network(allow=("127.0.0.1",)))
INFLATED = 128 << 20  # six times the bound below: enough to show a decoder that does not stop at the cap
MB = 1 << 20


def _zeros_deflated(wbits: int, size: int) -> bytes:
    """``size`` zero bytes compressed (``wbits`` picks gzip, zlib or raw deflate), made without
    holding them."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = bytes(MB)
    return b"".join(compressor.compress(block) for _ in range(size // MB)) + compressor.flush()


def _zeros_zstd(size: int) -> bytes:
    """``size`` zero bytes in a zstd frame. Without the zstandard module (the bench dependency group
    brings it), a frame's magic number and zeros: httpx then has no zstd decoder to inflate it, and
    the fetch must refuse the coding all the same."""
    try:
        import zstandard
    except ImportError:
        return b"\x28\xb5\x2f\xfd" + bytes(13_000)
    compressor = zstandard.ZstdCompressor(level=19).compressobj()
    block = bytes(MB)
    return b"".join(compressor.compress(block) for _ in range(size // MB)) + compressor.flush()


NEAR_CAP = random.Random(7).randbytes(190_000)


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


PAGE = b"<html><body><article><p>A page served compressed, as most are.</p></article></body></html>"


@functools.cache
def bodies() -> dict[str, tuple[str, bytes]]:
    """What each path serves: made once, by the test process that runs this file (compressing
    400 MB takes seconds, which every process collecting the suite would pay at import)."""
    return {
        "/gzip-in-gzip": ("gzip, gzip", gzip.compress(_zeros_deflated(zlib.MAX_WBITS | 16, INFLATED), 9)),
        "/zstd": ("zstd", _zeros_zstd(INFLATED)),
        "/gzip": ("gzip", _zeros_deflated(zlib.MAX_WBITS | 16, 64 * MB)),
        "/deflate-raw": ("deflate", _zeros_deflated(-zlib.MAX_WBITS, 64 * MB)),
        "/page-gzip": ("gzip", gzip.compress(PAGE)),
        "/page-deflate": ("deflate", zlib.compress(PAGE)),
        "/page-raw-deflate": ("deflate", zlib.compress(PAGE)[2:-4]),  # without zlib's header, as some send
        # Just under the cap, compressed or not (random bytes do not shrink): the whole body counts once.
        "/near-cap-raw-deflate": ("deflate", _raw_deflate(NEAR_CAP)),
    }


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def do_GET(self) -> None:
            encoding, body = bodies()[self.path]
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(ConnectionError):  # the client hangs up at the cap
                self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("path", ["/gzip-in-gzip", "/zstd", "/gzip", "/deflate-raw"])
async def test_a_compression_bomb_is_refused_without_inflating_it(server: str, path: str) -> None:
    assert len(bodies()[path][1]) < LIMITS.max_bytes  # small on the wire: only decoding can stop it
    tracemalloc.start()
    try:
        with pytest.raises(FetchError, match=r"larger than the limit|not supported"):
            await fetch(server + path, policy=LOOPBACK, limits=LIMITS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * MB, f"{peak / MB:.0f} MB held decoding {path}"


@pytest.mark.parametrize("path", ["/page-gzip", "/page-deflate", "/page-raw-deflate"])
async def test_compressed_pages_still_read(server: str, path: str) -> None:
    page = await fetch(server + path, policy=LOOPBACK, limits=LIMITS)
    assert page.body == PAGE


async def test_a_raw_deflate_body_near_the_cap_is_counted_once(server: str) -> None:
    # The decoder learns a deflate body lacks zlib's header from its first chunk and decodes that
    # chunk again: counted twice, the body went over the cap it is under.
    page = await fetch(server + "/near-cap-raw-deflate", policy=LOOPBACK, limits=LIMITS)
    assert page.body == NEAR_CAP
