"""What a sandbox worker loads: every worker and block shares (and forks) the zygote's heap, so
the runtime keeps to the standard library and a few small modules there."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.live_server import ROOT

# Server-side libraries, each several MiB of heap (asyncio brings ssl, concurrent.futures...).
NOT_IN_A_WORKER = ("asyncio", "pydantic", "sqlalchemy", "structlog", "httpx", "fastapi", "ssl")


def test_the_sandbox_worker_imports_no_server_library() -> None:
    code = (
        "import json, sys, app.runtime.worker\n"
        "print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(done.stdout))
    assert loaded.isdisjoint(NOT_IN_A_WORKER), sorted(loaded & set(NOT_IN_A_WORKER))
