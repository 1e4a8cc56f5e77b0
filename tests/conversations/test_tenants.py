"""API keys and tenants: every conversation belongs to the tenant of the key that created it."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import delete
from typer.testing import CliRunner

from app.cli import cli
from app.kit.db import create_engine
from app.llm.scripted import ScriptedLLM
from app.models import ApiKey
from tests.conftest import AppFactory

KEYS = "acme:key-acme-123,globex:key-globex-456"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_foreign_conversation_is_404_for_every_route(make_client: AppFactory, llm: ScriptedLLM) -> None:
    llm.script("hello acme")
    async with make_client(api_keys=KEYS) as client:
        created = await client.post("/v1/conversations", json={"input": "hi"}, headers=bearer("key-acme-123"))
        assert created.status_code == 201
        conv = created.json()["conversation_id"]
        other = bearer("key-globex-456")
        for response in (
            await client.get(f"/v1/conversations/{conv}", headers=other),
            await client.get(f"/v1/conversations/{conv}/messages", headers=other),
            await client.post(f"/v1/conversations/{conv}/messages", json={"input": "x"}, headers=other),
            await client.delete(f"/v1/conversations/{conv}", headers=other),
        ):
            assert response.status_code == 404
            assert response.json()["code"] == "not_found"
        mine = await client.get(f"/v1/conversations/{conv}", headers=bearer("key-acme-123"))
        assert mine.status_code == 200
    assert len(llm.requests) == 1


async def test_missing_or_wrong_key_is_401(make_client: AppFactory, llm: ScriptedLLM) -> None:
    async with make_client(api_keys=KEYS) as client:
        for headers in ({}, bearer("wrong"), {"Authorization": "Basic abc"}):
            response = await client.post("/v1/conversations", json={"input": "hi"}, headers=headers)
            assert response.status_code == 401
            assert response.json()["code"] == "unauthorized"
        assert (await client.get("/healthz")).status_code == 200
    assert llm.requests == []


async def test_open_mode_on_loopback_uses_the_local_tenant(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script("hi")
    assert (await client.post("/v1/conversations", json={"input": "hi"})).status_code == 201


async def test_keys_created_with_the_cli_are_accepted(
    make_client: AppFactory, store: dict[str, str | None], llm: ScriptedLLM
) -> None:
    env = {"SABRE_DATABASE_URL": str(store["database_url"])}
    # The CLI runs its own event loop, so it gets a thread of its own.
    result = await asyncio.to_thread(
        CliRunner().invoke, cli, ["keys", "create", "--tenant", "initech"], env=env
    )
    assert result.exit_code == 0, result.output
    secret = result.output.strip().splitlines()[-1]
    assert secret.startswith("sk-sabre-")
    bad = await asyncio.to_thread(
        CliRunner().invoke, cli, ["keys", "create", "--tenant", "bad tenant!"], env=env
    )
    assert bad.exit_code != 0
    llm.script("hello initech")
    try:
        async with make_client() as client:
            # Keys exist in the store now, so anonymous requests are refused.
            anonymous = await client.post("/v1/conversations", json={"input": "hi"})
            assert anonymous.status_code == 401
            ok = await client.post("/v1/conversations", json={"input": "hi"}, headers=bearer(secret))
            assert ok.status_code == 201, ok.text
    finally:
        # The store is shared by the session: put it back in open mode for the other tests.
        engine = create_engine(str(store["database_url"]))
        async with engine.begin() as connection:
            await connection.execute(delete(ApiKey))
        await engine.dispose()
