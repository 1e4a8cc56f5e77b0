"""A PostgreSQL connection lost under the service (a database restart, a cut network): the request
that meets it gets a retryable 503, the next one is served, and nothing earlier is lost."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory
from tests.conversations.test_external_tools import block


async def _terminate_connections(database_url: str) -> int:
    """Kill every server process of the database but our own (what a restart does to a pool)."""
    dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
    admin = await asyncpg.connect(dsn)
    try:
        killed: list[Any] = await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    finally:
        await admin.close()
    return len(killed)


async def test_a_lost_connection_is_a_retryable_503(
    make_client: AppFactory, llm: ScriptedLLM, store: dict[str, str | None]
) -> None:
    database_url = store["database_url"]
    assert database_url is not None
    if database_url.startswith("sqlite"):
        pytest.skip("an embedded SQLite file has no connection to lose")
    llm.script(block("print(2 + 2)"), "four", block("print(3 + 3)"), "six")
    async with make_client() as client:
        created = await client.post("/v1/conversations", json={"input": "two and two?"})
        assert created.status_code == 201, created.text
        conversation = created.json()["conversation_id"]
        assert await _terminate_connections(database_url) >= 1  # the app's pooled connection

        lost = await client.post(f"/v1/conversations/{conversation}/messages", json={"input": "three?"})
        assert lost.status_code == 503, lost.text
        assert lost.headers["content-type"] == "application/problem+json"
        assert lost.headers["retry-after"] == "1"
        assert lost.json()["code"] == "database_unavailable"

        retried = await client.post(f"/v1/conversations/{conversation}/messages", json={"input": "three?"})
        assert retried.status_code == 200, retried.text
        assert retried.json()["output"] == "six"
        messages = (await client.get(f"/v1/conversations/{conversation}/messages")).json()["data"]
    texts = [p.get("text") for m in messages for p in m["parts"] if p["kind"] == "text"]
    assert texts == ["two and two?", "four", "three?", "six"]
