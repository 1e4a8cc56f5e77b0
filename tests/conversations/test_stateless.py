"""Two server processes on one PostgreSQL and one Redis serve one conversation alternately."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import pytest

from app.llm.scripted import Reply, ScriptedLLM
from tests.conversations.test_external_tools import GET_ORDER, block


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _server(
    env: dict[str, str], processes: list[subprocess.Popen[bytes]] | None = None, *, log: Path | None = None
) -> Iterator[str]:
    """A ``sabre serve`` process on a free port; its output goes to ``log`` (for a failing test's
    diagnostics) or nowhere."""
    port = _free_port()
    sink = log.open("ab") if log is not None else subprocess.DEVNULL
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
        env=env,
        stdout=sink,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    if processes is not None:
        processes.append(process)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        if log is not None:
            sink.close()  # type: ignore[union-attr]


async def _ready(url: str) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(200):
            try:
                if (await client.get(f"{url}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"server at {url} did not become ready")


def server_env(*, database_url: str, redis_url: str, llm: ScriptedLLM, home: Path) -> dict[str, str]:
    """The environment of the ``sabre serve`` processes of one store."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "SABRE_DATABASE_URL": database_url,
        "SABRE_REDIS_URL": redis_url,
        "SABRE_DATA_DIR": str(home / "data"),
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": "sk-test",
        "SABRE_LLM_API": "chat",
        "SABRE_MODEL": "scripted-model",
        "SABRE_RUNTIME_WORKERS": "1",
        "SABRE_RUNTIME_PRELOAD": "",
        # A killed server's lock lapses within the tests' 10 s wait; not so short that a renewal
        # delayed on a loaded machine lets a live turn look dead (a watcher on B then ends early).
        "SABRE_LOCK_LEASE_SECONDS": "5",
    }


@asynccontextmanager
async def server_pair(
    env: dict[str, str], logs: Path, processes: list[subprocess.Popen[bytes]] | None = None
) -> AsyncIterator[tuple[str, str]]:
    """Servers A and B, started together, once both are ready; their logs are
    ``logs/server-a.log`` and ``logs/server-b.log``."""
    with (
        _server(env, processes, log=logs / "server-a.log") as a,
        _server(env, processes, log=logs / "server-b.log") as b,
    ):
        await asyncio.gather(_ready(a), _ready(b))
        yield a, b


@pytest.fixture
async def two_servers(
    own_postgres_url: str,
    redis_url: str,
    llm: ScriptedLLM,
    tmp_path: Path,
    servers: list[subprocess.Popen[bytes]],
) -> AsyncIterator[tuple[str, str]]:
    env = server_env(database_url=own_postgres_url, redis_url=redis_url, llm=llm, home=tmp_path)
    async with server_pair(env, tmp_path, servers) as pair:
        yield pair


@pytest.fixture
def servers() -> list[subprocess.Popen[bytes]]:
    """The processes of ``two_servers``, A then B (a test may kill one)."""
    return []


async def test_create_on_a_resume_on_b_resume_on_a(two_servers: tuple[str, str], llm: ScriptedLLM) -> None:
    a, b = two_servers
    llm.script(
        block(
            "total = 0\nfor n in range(2):\n"
            "    total += get_order_details(order_id=str(n))['amount']\nprint('total', total)"
        ),
        "The total is 30.",
        block("print(total * 2)"),
        "Doubled: 60.",
    )
    async with httpx.AsyncClient(timeout=30) as client:
        turn = (
            await client.post(f"{a}/v1/conversations", json={"input": "sum my orders", "tools": [GET_ORDER]})
        ).json()
        conv = turn["conversation_id"]
        for server, amount in ((b, 10), (a, 20)):
            call = turn["pending_tool_calls"][0]
            response = await client.post(
                f"{server}/v1/conversations/{conv}/tool-results",
                json={"results": [{"tool_call_id": call["id"], "output": {"amount": amount}}]},
            )
            assert response.status_code == 200, response.text
            turn = response.json()
        assert turn["status"] == "completed"
        assert turn["output"] == "The total is 30."
        # The namespace (``total``) follows the conversation to the other process too.
        follow_up = await client.post(f"{b}/v1/conversations/{conv}/messages", json={"input": "double it"})
        assert follow_up.json()["output"] == "Doubled: 60."
        assert "<helpers_result>\n60\n</helpers_result>" in llm.requests[-1].all_text
        state = (await client.get(f"{a}/v1/conversations/{conv}")).json()
        assert state["version"] == 4
        assert state["status"] == "idle"


async def test_a_server_killed_during_a_resume_leaves_the_conversation_resumable(
    two_servers: tuple[str, str], servers: list[subprocess.Popen[bytes]], llm: ScriptedLLM, tmp_path: Path
) -> None:
    """A dies (SIGKILL) while its resume waits for the model: nothing of that turn is stored, the
    paused block is still there, and the same results sent to B complete the turn."""
    a, b = two_servers
    llm.script(
        block('order = get_order_details("A1")\nprint(order)'),
        Reply(text="never delivered", delay=6),
        "Shipped.",
    )
    async with httpx.AsyncClient(timeout=60) as client:
        body = {"input": "where is A1?", "tools": [GET_ORDER]}
        created = await client.post(f"{a}/v1/conversations", json=body)
        turn = created.json()
        assert turn["status"] == "awaiting_tool_results", turn
        call = turn["pending_tool_calls"][0]
        path = f"/v1/conversations/{turn['conversation_id']}"
        results = {"results": [{"tool_call_id": call["id"], "output": "shipped"}]}
        dying = asyncio.ensure_future(client.post(f"{a}{path}/tool-results", json=results))
        for _ in range(100):  # until A's resume is waiting for the model
            if len(llm.requests) == 2:
                break
            await asyncio.sleep(0.05)
        os.killpg(servers[0].pid, signal.SIGKILL)
        with pytest.raises(httpx.TransportError):
            await dying
        for _ in range(100):  # "running" until the dead A's lock lease runs out
            state = (await client.get(f"{b}{path}")).json()
            if state["status"] != "running":
                break
            await asyncio.sleep(0.1)
        assert state["status"] == "awaiting_tool_results", state
        assert [c["id"] for c in state["pending_tool_calls"]] == [call["id"]]
        done = await client.post(f"{b}{path}/tool-results", json=results)
    assert done.status_code == 200, done.text
    answered = done.json()
    # A known rare failure (B's turn "failed"): say why first, before pytest shortens the message.
    asked = [r.last_user_text[:40] for r in llm.requests]
    why = f"B's turn {answered['status']}: {answered.get('error')}; {len(asked)} model requests: {asked}"
    if answered["status"] == "failed":  # B's log says what broke (turn_crashed carries a traceback)
        why += "\nserver B:\n" + (tmp_path / "server-b.log").read_text(errors="replace")[-6000:]
    assert answered["output"] == "Shipped.", why
