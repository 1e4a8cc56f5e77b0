"""schemathesis over the served spec against a real ``sabre serve`` on each store: every phase
(examples, coverage, fuzzing, stateful through the spec's links), every check (no 5xx; status,
content type, headers and body as documented; valid input accepted, invalid refused; auth enforced
on every operation, ``ignored_auth``), a fixed seed.

Short by default (CI); the long run is the same test with more examples:
``SABRE_SCHEMATHESIS_EXAMPLES=100 uv run pytest -n 0 tests/api/test_schemathesis.py -s``
(or ``.ci/schemathesis``). The summary (operations, cases generated, failures) is printed with ``-s``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.llm.scripted import ScriptedLLM
from tests.live_server import ROOT, demo_responder, sabre_server

CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = int(os.environ.get("SABRE_SCHEMATHESIS_EXAMPLES", "2"))
KEY = "sk-schemathesis"


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedLLM]:
    with ScriptedLLM(responder=demo_responder) as llm:
        yield llm


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, model: ScriptedLLM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    store: dict[str, str | None] = {}
    if request.param == "postgres":
        store = {
            "database_url": request.getfixturevalue("module_postgres_url"),
            "redis_url": request.getfixturevalue("redis_url"),
        }
    with sabre_server(
        data_dir=tmp_path_factory.mktemp("st"),
        llm_url=model.base_url,
        api_keys=f"schemathesis:{KEY}",
        **store,  # type: ignore[arg-type]
    ) as url:
        yield url


def run_schemathesis(url: str, *, examples: int) -> tuple[int, str]:
    """``st run`` over the served spec; its exit code and output."""
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "run",
        f"{url}/openapi.json", "--url", url,
        "--checks", "all", "--max-examples", str(examples),
        "--no-color", "--suppress-health-check", "all",
    ]  # fmt: skip
    env = {**os.environ, "SABRE_SCHEMATHESIS_KEY": KEY}  # the config's bearer token
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    return done.returncode, done.stdout + done.stderr


def test_the_api_keeps_its_spec(server: str) -> None:
    code, output = run_schemathesis(server, examples=EXAMPLES)
    summary = output[output.find("SUMMARY") :] if "SUMMARY" in output else output[-3000:]
    print(summary)
    failures = output[output.find("FAILURES") :] if "FAILURES" in output else output
    assert code == 0, failures[:6000] + "\n…\n" + summary
    tested = re.search(r"Tested: (\d+)", output)
    generated = re.search(r"(\d+) generated", output)
    assert tested is not None, summary
    assert generated is not None, summary
    assert int(tested.group(1)) >= 17, summary
    assert int(generated.group(1)) > 100, summary
