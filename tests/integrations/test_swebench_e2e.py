"""The SWE-bench runner end to end: ``sabre swe``'s code against a real ``sabre serve`` (SQLite) and
the scripted model, on a local git repository whose test fails at the base commit.

One server and one scripted model serve the module; each instance's problem statement carries a plan
token, so the model answers each conversation from its own script whatever the order the runner's
workers take them in. The first run has a fix, a conversation of 39 tool calls (30 of them in one
pause) with outputs of 150 KB and 3 MB and a failed edit, a turn that fails, and a repository that is
missing; the second run resumes. A second server, whose tool calls expire after 2 s, meets a slow tool.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sabre_swebench.cli import main as swe_main
from sabre_swebench.client import SabreClient
from sabre_swebench.instances import Instance
from sabre_swebench.runner import RunConfig, run_instance

from app.llm.scripted import Reply, ScriptedLLM
from tests.events.test_turn_operations import Plans, _free_port
from tests.kit.test_jobs import process

SHORT_TTL_SECONDS = 2  # the second server's pending-call lifetime: the "expire" instance outlasts it


def block(code: str) -> str:
    return f"<helpers>\n{code}\n</helpers>"


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture(scope="module")
def plans() -> Plans:
    return Plans()


@pytest.fixture(scope="module")
def model(plans: Plans) -> Iterator[ScriptedLLM]:
    with ScriptedLLM(responder=plans) as server:
        yield server


@contextmanager
def serving(model: ScriptedLLM, root: Path, **settings: str) -> Iterator[str]:
    """``sabre serve`` on its own SQLite store, the scripted model behind it."""
    port = _free_port()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(root),
        "SABRE_DATA_DIR": str(root / "data"),
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "sk-test",
        "SABRE_LLM_API": "chat",
        "SABRE_LLM_MAX_RETRIES": "0",
        "SABRE_MODEL": "scripted-model",
        "SABRE_RUNTIME_WORKERS": "3",  # one per runner worker: a paused block keeps its process
        "SABRE_RUNTIME_PRELOAD": "",
        **settings,
    }
    url = f"http://127.0.0.1:{port}"
    log = root / "serve.log"
    with process(["-m", "app.cli", "serve", "--port", str(port)], env=env, log=log):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError(f"sabre serve did not start:\n{log.read_text()[-3000:]}")
        yield url


@pytest.fixture(scope="module")
def server(model: ScriptedLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(model, tmp_path_factory.mktemp("swe-server")) as url:
        yield url


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``repos/acme__calc``: add() subtracts, and its test fails; the base commit's sha."""
    root = tmp_path_factory.mktemp("repos")
    repo = root / "acme__calc"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text(
        "from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n"
    )
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "base", cwd=repo)
    base = git("rev-parse", "HEAD", cwd=repo).strip()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b  # fixed upstream later\n")
    git("commit", "-qam", "later", cwd=repo)  # the checkout must go back to the base commit
    return root, base


def instance(instance_id: str, token: str, base: str, repo: str = "acme/calc") -> dict[str, Any]:
    return {
        "instance_id": instance_id,
        "repo": repo,
        "base_commit": base,
        "problem_statement": f"add(2, 3) returns -1 ({token})",
        "hints_text": "",
    }


def replies_of(model: ScriptedLLM, token: str) -> list[str]:
    """The texts of the requests the model got for a plan (its conversation), in order."""
    return [r.all_text for r in model.requests if token in r.all_text]


def test_a_run_then_a_resumed_run(
    server: str,
    model: ScriptedLLM,
    plans: Plans,
    repos: tuple[Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    repos_dir, base = repos
    fix = plans.add(
        block(
            'print(str_replace_editor(command="view", path="calc.py"))\n'
            'print(bash(command="python3 test_calc.py"))'
        ),
        block(
            'print(str_replace_editor(command="str_replace", path="calc.py", '
            'old_str="return a - b", new_str="return a + b"))\n'
            'print(bash(command="python3 test_calc.py"))'
        ),
        "add() now adds; test_calc.py passes.",
    )
    many = plans.add(
        block(
            'outs = parallel(bash, [f"echo step {i}" for i in range(30)])\n'
            'outs += [bash(command=f"echo step {i}") for i in range(30, 35)]\n'
            'big = bash(command="python3 -c \'print(\\"x\\" * 150000)\'")\n'
            'huge = bash(command="python3 -c \'print(\\"y\\" * 3000000)\'")\n'
            "try:\n"
            '    str_replace_editor(command="str_replace", path="calc.py", old_str="nowhere", new_str="z")\n'
            "except ToolError as exc:\n"
            '    print("edit failed:", exc)\n'
            'print(str_replace_editor(command="create", path="NOTES.md", file_text="notes\\n"))\n'
            'print(len(outs), outs[34].strip(), len(big), len(huge) < 600_000, "bytes of output cut" in huge)'
        ),
        "Wrote NOTES.md.",
    )
    broken = plans.add(Reply(status=500, text="model down"), "Nothing to change.")
    missing = plans.add("never asked")
    instances = tmp_path / "instances.jsonl"
    instances.write_text(
        "".join(
            json.dumps(record) + "\n"
            for record in (
                instance("acme__calc-1", fix, base),
                instance("acme__calc-2", many, base),
                instance("acme__calc-3", broken, base),
                instance("ghost__repo-1", missing, base, repo="ghost/repo"),
            )
        )
    )
    out = tmp_path / "run"
    argv = [
        str(instances),
        "--repos",
        str(repos_dir),
        "--out",
        str(out),
        "--url",
        server,
        "--workers",
        "3",
        "--output-cap",
        "500000",
        "--name",
        "sabre-scripted",
    ]

    assert swe_main(argv) == 1  # some failed: exit 1, after running every instance
    summary = capsys.readouterr().err
    print(summary)  # shown with -s or on failure: the figures of the run

    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    by_id = {p["instance_id"]: p for p in predictions}
    assert sorted(by_id) == ["acme__calc-1", "acme__calc-2"]
    assert {p["model_name_or_path"] for p in predictions} == {"sabre-scripted"}

    # The fix: at the base commit the test fails; with the patch applied it passes.
    patch = by_id["acme__calc-1"]["model_patch"]
    assert "-    return a - b\n+    return a + b\n" in patch
    fresh = tmp_path / "fresh"
    git("clone", "-q", str(repos_dir / "acme__calc"), str(fresh), cwd=tmp_path)
    git("checkout", "-q", base, cwd=fresh)
    assert subprocess.run(["python3", "test_calc.py"], cwd=fresh, capture_output=True).returncode == 1
    subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=fresh, check=True)
    assert subprocess.run(["python3", "test_calc.py"], cwd=fresh, capture_output=True).returncode == 0
    # The model saw the failing test, then the passing one.
    fix_texts = replies_of(model, fix)
    assert "AssertionError: -1" in fix_texts[1]
    assert "[exit code 1]" in fix_texts[1]
    assert "ok" in fix_texts[2].split("<helpers_result>")[-1]

    # 39 tool calls in one conversation, outputs of 150 KB (whole) and 3 MB (cut), a failed edit.
    notes = by_id["acme__calc-2"]["model_patch"]
    assert "+++ b/NOTES.md" in notes
    assert "calc.py" not in notes
    last = replies_of(model, many)[-1].split("<helpers_result>")[-1]
    assert "edit failed: no replacement was made: old_str did not appear verbatim in calc.py" in last
    assert "35 step 34 150001 True True" in last

    report = {r["instance_id"]: r for r in map(json.loads, (out / "report.jsonl").read_text().splitlines())}
    assert report["acme__calc-2"]["tool_calls"] == 39
    assert report["acme__calc-2"]["pauses"] == 10  # 30 calls in one pause, then 9 one at a time
    assert report["acme__calc-2"]["round_trips"] == 11
    assert report["acme__calc-1"]["status"] == "patched"
    assert report["acme__calc-1"]["tool_calls"] == 4
    assert report["acme__calc-1"]["sabre_seconds"] > 0
    assert report["acme__calc-1"]["tool_seconds"] > 0
    # Failures are readable lines, and the run went on past each.
    assert report["acme__calc-3"]["status"] == "failed"
    assert "turn failed" in report["acme__calc-3"]["error"]
    assert report["ghost__repo-1"]["status"] == "failed"
    assert "ghost/repo: not found in" in report["ghost__repo-1"]["error"]
    for line in ("acme__calc-3", "turn failed", "ghost__repo-1", "not found", "2 patched, 0 empty, 2 failed"):
        assert line in summary
    assert not (out / "checkouts" / "acme__calc-1").exists()  # checkouts are removed

    # Resume: the finished instances are skipped; the failed ones run again.
    calls_before = plans.calls[fix], plans.calls[many]
    assert swe_main(argv) == 1  # the missing repository is still missing
    summary = capsys.readouterr().err
    assert (plans.calls[fix], plans.calls[many]) == calls_before
    assert "2 skipped" in summary
    lines = (out / "predictions.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["instance_id"] for line in lines) == [
        "acme__calc-1",
        "acme__calc-2",
        "acme__calc-3",
    ]
    assert json.loads(lines[2])["model_patch"] == ""  # completed with no change: an empty patch


def test_expired_tool_calls_are_a_failed_line(
    model: ScriptedLLM,
    plans: Plans,
    repos: tuple[Path, str],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    repos_dir, base = repos
    expire = plans.add(block(f'print(bash(command="sleep {SHORT_TTL_SECONDS + 1}; echo late"))'))
    instances = tmp_path / "instances.json"
    instances.write_text(json.dumps([instance("acme__calc-9", expire, base)]))
    ttl = {"SABRE_TOOL_CALL_TTL_SECONDS": str(SHORT_TTL_SECONDS)}
    with serving(model, tmp_path_factory.mktemp("swe-short-ttl"), **ttl) as url:
        argv = [str(instances), "--repo", str(repos_dir / "acme__calc"), "--out", str(tmp_path), "--url", url]
        assert swe_main(argv) == 1
    summary = capsys.readouterr().err
    [report] = [json.loads(line) for line in (tmp_path / "report.jsonl").read_text().splitlines()]
    assert report["status"] == "failed"
    assert report["error"].startswith("tool-results: 410 tool_calls_expired: The pending tool calls expired")
    assert report["tool_seconds"] >= SHORT_TTL_SECONDS
    assert "tool_calls_expired" in summary
    assert not (tmp_path / "predictions.jsonl").exists()


class DroppingTransport(httpx.AsyncBaseTransport):
    """Real HTTP, except that the first answer to a tool-results POST is lost on the way back (the
    server did the work): what a client sees when a connection dies after its request went out."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.dropped: list[str] = []
        self.keys: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/tool-results"):
            self.keys.append(request.headers["idempotency-key"])
            if not self.dropped:
                await response.aread()
                await response.aclose()
                self.dropped.append(request.headers["idempotency-key"])
                raise httpx.ReadError("connection reset by peer (dropped by the test)")
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_lost_answer_is_retried_with_its_key_and_runs_once(
    server: str, plans: Plans, repos: tuple[Path, str], tmp_path: Path
) -> None:
    repos_dir, base = repos
    token = plans.add(
        block('print(bash(command="echo one >> log.txt; cat log.txt"))'),
        "Logged once.",
    )
    transport = DroppingTransport()
    http = httpx.AsyncClient(transport=transport, base_url=server, timeout=60)
    client = SabreClient(server, http=http)
    config = RunConfig(
        output_dir=tmp_path / "out", workdir=tmp_path / "work", repo_path=repos_dir / "acme__calc"
    )
    task = Instance.model_validate(instance("acme__calc-7", token, base))
    try:
        outcome = await run_instance(task, config=config, client=client)
    finally:
        await http.aclose()
    assert outcome.status == "patched", outcome.error
    assert transport.dropped  # the first answer was lost ...
    assert transport.keys == transport.dropped * 2  # ... and the retry reused its key
    assert plans.calls[token] == 2  # the block once, the answer once: no second turn
    assert outcome.round_trips == 2
    [prediction] = (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()
    assert "+one\n" in json.loads(prediction)["model_patch"]
