"""Two server processes on one PostgreSQL and one Redis serve one conversation alternately."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from app.llm.scripted import ScriptedLLM
from tests.conversations.test_external_tools import GET_ORDER, block


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _server(env: dict[str, str]) -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


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


@pytest.fixture
async def two_servers(
    postgres_url: str, redis_url: str, llm: ScriptedLLM, tmp_path: Path
) -> AsyncIterator[tuple[str, str]]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "SABRE_DATABASE_URL": postgres_url,
        "SABRE_REDIS_URL": redis_url,
        "SABRE_DATA_DIR": str(tmp_path / "data"),
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": "sk-test",
        "SABRE_LLM_API": "chat",
        "SABRE_MODEL": "scripted-model",
        "SABRE_RUNTIME_WORKERS": "1",
        "SABRE_RUNTIME_PRELOAD": "",
    }
    with _server(env) as a, _server(env) as b:
        await asyncio.gather(_ready(a), _ready(b))
        yield a, b


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
