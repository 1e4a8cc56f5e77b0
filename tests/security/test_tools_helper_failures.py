"""A service helper that meets hostile input fails in the model's code, never the turn.

The pages a block fetches come from servers anyone runs: a page declaring a charset whose codec
cannot decode with ``errors="replace"`` (``undefined``, ``idna``, ``punycode``) raised
UnicodeError out of ``Web.get``, which the turn loop did not expect from a helper: the block was
killed and the turn failed as an internal error (turn_crashed). Now the codec falls back to UTF-8,
and anything else a service helper raises unexpectedly is the call's error in the code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.helpers import HELPERS, HelperContext
from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def do_GET(self) -> None:
            body = b"caf\xe9 \xff\xfe text"
            self.send_response(200)
            self.send_header("Content-Type", f"text/plain; charset={self.path.strip('/')}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(ConnectionError):
                self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("charset", ["undefined", "idna", "punycode", "utf-8"])
async def test_a_page_with_a_hostile_charset_reaches_the_code_as_text(
    make_client: AppFactory, llm: ScriptedLLM, tmp_path: Path, site: str, charset: str
) -> None:
    personas = tmp_path / "personas"
    personas.mkdir()
    (personas / "local.yaml").write_text(
        "name: local\ndescription: Reads the local site.\nidentity: You read pages.\n"
        "network:\n  allow: ['127.0.0.1']\n",
        encoding="utf-8",
    )
    code = f"text = Web.get({site + '/' + charset!r})\nprint('got', len(text), 'chars')"
    llm.script(f"<helpers>\n{code}\n</helpers>", "done")
    async with make_client(personas_dir=personas) as client:
        created = await client.post("/v1/conversations", json={"input": "read", "persona": "local"})
        turn = created.json()
    assert created.status_code == 201, created.text[:500]
    assert turn["status"] == "completed", turn
    assert "got " in llm.requests[1].all_text


async def test_any_unexpected_failure_of_a_service_helper_is_the_calls_error(
    client: Any, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever else a helper's libraries raise on input no one foresaw (a parser, a codec, a
    # RecursionError) is the call's error in the code, and the turn goes on.
    async def broken(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setitem(HELPERS, "llm_call", dataclasses.replace(HELPERS["llm_call"], handler=broken))
    code = (
        "try:\n    llm_call('x', 'y')\nexcept Exception as exc:\n    print('caught', type(exc).__name__, exc)"
    )
    llm.script(f"<helpers>\n{code}\n</helpers>", "done")
    turn = (await client.post("/v1/conversations", json={"input": "go"})).json()
    assert turn["status"] == "completed", turn
    assert "caught" in llm.requests[1].all_text
    assert "llm_call failed: maximum recursion depth exceeded" in llm.requests[1].all_text
