"""A real ``sabre serve`` on a free port with a scripted model, for tests of clients over HTTP
(schemathesis, the SDKs, ``sabre chat``) and for ``.ci/clients``.

The demo model answers by what the user wrote, so one server serves every client test:
``tool ...`` writes a block that calls the request's first external tool, ``plot ...`` a block that
draws a figure, ``code ...`` a block that prints, ``slow ...`` a reply streamed slowly; anything
else is echoed. Run it on its own: ``uv run python -m tests.live_server`` (prints the URL, serves
until interrupted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from app.llm.scripted import RecordedRequest, Reply, ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
RESULT = "<helpers_result>"


def free_port() -> int:
    """A port nobody listens on (for a moment)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def demo_responder(request: RecordedRequest) -> str | Reply:
    """The demo model (see the module docstring)."""
    last = request.messages[-1].text if request.messages else ""
    asked = request.last_user_text.strip().lower()
    if RESULT in last:
        result = last.split(RESULT, 1)[1].split("</helpers_result>", 1)[0].strip()
        return f"The block printed: {result[:200]}"
    if asked.startswith("tool"):
        name = _tool_name(request)
        if name is not None:
            return f'Let me look that up.\n<helpers>\nprint({name}(order_id="A1"))\n</helpers>'
        return "No external tool was given to this conversation."
    if asked.startswith("plot"):
        return (
            "Here is a figure.\n<helpers>\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 3, 2])\nplt.title('demo')\nprint('drawn')\n</helpers>"
        )
    if asked.startswith("code"):
        return "Computing.\n<helpers>\nprint(sum(range(10)))\n</helpers>"
    if asked.startswith("slow"):
        return Reply(text="This answer streams slowly, word by word.", chunk_size=4, chunk_delay=0.05)
    return f"You said: {request.last_user_text.strip()[:200]}"


def _tool_name(request: RecordedRequest) -> str | None:
    """The last tool the prompt documents (a request's tools come after the persona's)."""
    names = re.findall(r"^### ([A-Za-z_]\w*)\(", request.instructions, flags=re.MULTILINE)
    return names[-1] if names else None


@contextlib.contextmanager
def sabre_server(
    *,
    data_dir: Path,
    llm_url: str,
    database_url: str | None = None,
    redis_url: str | None = None,
    api_keys: str = "",
    log: Path | None = None,
) -> Iterator[str]:
    """A ``sabre serve`` process on a free port, ready; its base URL. Stopped (SIGTERM) on exit."""
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(data_dir),
        "SABRE_DATA_DIR": str(data_dir / "data"),
        "OPENAI_BASE_URL": llm_url,
        "OPENAI_API_KEY": "sk-test",
        "SABRE_LLM_API": "chat",
        "SABRE_MODEL": "scripted-model",
        "SABRE_RUNTIME_WORKERS": "1",
        "SABRE_RUNTIME_PRELOAD": "",
        "SABRE_RUNTIME_LAZY_START": "true",
        "SABRE_API_KEYS": api_keys,
    }
    if database_url:
        env["SABRE_DATABASE_URL"] = database_url
    if redis_url:
        env["SABRE_REDIS_URL"] = redis_url
    output = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=output,
        stderr=output,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log:
            output.close()  # type: ignore[union-attr]


def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sabre serve exited with {process.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"sabre serve at {url} did not become ready")


def main() -> None:
    """Serve the demo model and ``sabre serve`` until interrupted; print {"url", "llm_url"} as JSON."""
    parser = argparse.ArgumentParser(description="A sabre serve with the demo scripted model.")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--api-keys", default="", help="SABRE_API_KEYS, e.g. t1:sk-one")
    args = parser.parse_args()
    # SIGTERM (what CI scripts send) unwinds like Ctrl-C, so the sabre serve child is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with (
        ScriptedLLM(responder=demo_responder) as llm,
        sabre_server(data_dir=args.data_dir, llm_url=llm.base_url, api_keys=args.api_keys) as url,
    ):
        print(json.dumps({"url": url, "llm_url": llm.base_url}), flush=True)
        with contextlib.suppress(KeyboardInterrupt, SystemExit):
            threading.Event().wait()


if __name__ == "__main__":
    main()
