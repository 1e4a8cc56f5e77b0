"""The LangGraph peer of bench/service_bench.py runs the DESIGN §9 workload: start → the model asks for
the external tool → the run interrupts and the response carries the call → resume with the result → the
model answers from it. Runs only with the ``bench`` dependency group and PostgreSQL configured."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from app.llm.scripted import RecordedRequest, Reply, ScriptedLLM, ScriptedToolCall


def _installed(module: str) -> bool:
    """Found, not imported: importing LangChain costs each test process about 4 s at collection,
    and only the process that runs this file needs it (the fixture imports the peer app)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


pytestmark = pytest.mark.skipif(
    not (_installed("langgraph.checkpoint.postgres") and _installed("langchain_openai")),
    reason="the bench dependency group is not installed",
)

PG_URL = os.environ.get("SABRE_TEST_DATABASE_URL", "")


def respond(request: RecordedRequest) -> Reply:
    """Ask for the order once; answer with what the tool message says."""
    last = request.body["messages"][-1]
    if last["role"] == "tool":
        return Reply(text=f"Your order is {json.loads(last['content'])['status']}.")
    return Reply(tool_calls=[ScriptedToolCall(name="get_order_details", arguments={"order_id": "7"})])


@pytest.fixture(scope="module")
async def peer() -> AsyncIterator[tuple[httpx.AsyncClient, ScriptedLLM]]:
    """The peer app in this process (its lifespan run, served over ASGI) on a fresh database."""
    if not PG_URL:
        if os.environ.get("SABRE_TEST_REQUIRE_SERVICES") == "1":
            pytest.fail("PostgreSQL (SABRE_TEST_DATABASE_URL) is required but not configured")
        pytest.skip("PostgreSQL (SABRE_TEST_DATABASE_URL) not configured")
    admin_dsn = PG_URL.replace("postgresql+asyncpg://", "postgresql://")
    name = f"sabre_test_lg_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_dsn, timeout=5)
    await admin.execute(f'CREATE DATABASE "{name}"')
    llm = ScriptedLLM(responder=respond).start()
    saved = {k: os.environ.get(k) for k in ("LANGGRAPH_DATABASE_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY")}
    os.environ.update(
        LANGGRAPH_DATABASE_URL=f"{admin_dsn.rsplit('/', 1)[0]}/{name}",
        OPENAI_BASE_URL=llm.base_url,
        OPENAI_API_KEY="sk-test",
    )
    try:
        from bench.langgraph_app import app

        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://peer") as client:
                yield client, llm
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        llm.stop()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_start_pauses_on_the_external_tool_and_resume_answers_from_its_result(
    peer: tuple[httpx.AsyncClient, ScriptedLLM],
) -> None:
    client, llm = peer
    started = await client.post("/conversations", json={"input": "where is order 7?"})
    assert started.status_code == 200, started.text
    turn = started.json()
    assert turn["status"] == "awaiting_tool_results"
    [call] = turn["pending_tool_calls"]
    assert call["name"] == "get_order_details"
    assert call["arguments"] == {"order_id": "7"}

    resumed = await client.post(
        f"/conversations/{turn['conversation_id']}/tool-results",
        json={"results": [{"tool_call_id": call["id"], "output": {"status": "shipped"}}]},
    )
    assert resumed.status_code == 200, resumed.text
    assert resumed.json() == {
        "conversation_id": turn["conversation_id"],
        "status": "completed",
        "pending_tool_calls": [],
        "output": "Your order is shipped.",
    }
    # The second model call carried the whole thread, restored from PostgreSQL, with the tool result.
    sent = llm.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[2]["tool_calls"][0]["id"] == call["id"]
    assert sent[3]["tool_call_id"] == call["id"]


async def test_a_resume_must_answer_exactly_the_pending_calls_of_a_paused_conversation(
    peer: tuple[httpx.AsyncClient, ScriptedLLM],
) -> None:
    client, _ = peer
    one = {"results": [{"tool_call_id": "call_forged", "output": {"status": "shipped"}}]}
    assert (await client.post("/conversations/nope/tool-results", json=one)).status_code == 404
    turn = (await client.post("/conversations", json={"input": "where is order 7?"})).json()
    url = f"/conversations/{turn['conversation_id']}/tool-results"
    assert (await client.post(url, json=one)).status_code == 422  # forged id
    call_id = turn["pending_tool_calls"][0]["id"]
    answer = {"tool_call_id": call_id, "output": {"status": "shipped"}}
    assert (await client.post(url, json={"results": [answer, answer]})).status_code == 422  # twice
    assert (await client.post(url, json={"results": []})).status_code == 422  # missing
    assert (await client.post(url, json={"results": [answer]})).json()["status"] == "completed"
    assert (await client.post(url, json={"results": [answer]})).status_code == 409  # not paused now
