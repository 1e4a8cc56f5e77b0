"""`sabre keys create | list | revoke | rotate` against a real server on both stores: names,
expiry, revocation and rotation take effect on the next request; bad input is a usage error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import pytest
from click.testing import Result
from sqlalchemy import delete, update
from typer.testing import CliRunner

from app.cli import cli
from app.kit.clock import utcnow
from app.kit.db import create_engine
from app.llm.scripted import ScriptedLLM
from app.models import ApiKey
from tests.conftest import AppFactory


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


Run = Callable[..., Awaitable[Result]]


@pytest.fixture
async def run(store: dict[str, str | None]) -> AsyncIterator[Run]:
    """Run `sabre keys …` on the test's store; every stored key is deleted afterwards (the store is
    shared by the session, and a stored key takes the other tests' servers out of open mode)."""
    env = {"SABRE_DATABASE_URL": str(store["database_url"])}

    async def run(*args: str) -> Result:
        # The CLI runs its own event loop, so it gets a thread of its own.
        return await asyncio.to_thread(CliRunner().invoke, cli, ["keys", *args], env=env)

    try:
        yield run
    finally:
        engine = create_engine(str(store["database_url"]))
        async with engine.begin() as connection:
            await connection.execute(delete(ApiKey))
        await engine.dispose()


def secret_of(result: Result) -> str:
    assert result.exit_code == 0, result.output
    secret = result.output.strip().splitlines()[-1]
    assert secret.startswith("sk-sabre-")
    return secret


def records(result: Result) -> list[dict[str, object]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]


def listed(result: Result) -> dict[str, dict[str, object]]:
    """The keys by name (the last of a name wins: a rotated key's successor is created later)."""
    return {str(r["name"]): r for r in records(result)}


async def test_list_revoke_and_rotate(
    run: Run, make_client: AppFactory, store: dict[str, str | None], llm: ScriptedLLM
) -> None:
    ci = secret_of(await run("create", "--tenant", "acme", "--name", "ci"))
    laptop = secret_of(await run("create", "--tenant", "acme", "--name", "laptop", "--expires-in", "30d"))
    other = secret_of(await run("create", "--tenant", "globex", "--name", "prod"))
    keys = listed(await run("list", "--json"))
    assert set(keys) == {"ci", "laptop", "prod"}
    assert keys["laptop"]["expires_at"] is not None
    assert keys["ci"]["expires_at"] is None
    assert all(k["status"] == "live" for k in keys.values())
    assert all(str(k["prefix"]).startswith("sk-sabre-") for k in keys.values())
    table = await run("list", "--tenant", "acme")
    assert table.exit_code == 0
    assert "laptop" in table.output
    assert "prod" not in table.output
    assert ci not in table.output
    assert laptop not in table.output

    llm.script(*["ok"] * 10)
    async with make_client() as client:

        async def status(key: str) -> int:
            return (await client.get("/v1/conversations", headers=bearer(key))).status_code

        assert [await status(k) for k in (ci, laptop, other)] == [200, 200, 200]

        # Revoke: refused on the very next request, on a server that is already running.
        revoked = await run("revoke", str(keys["ci"]["id"]))
        assert revoked.exit_code == 0, revoked.output
        refused = await client.get("/v1/conversations", headers=bearer(ci))
        assert refused.status_code == 401
        assert refused.json()["code"] == "unauthorized"
        again = await run("revoke", str(keys["ci"]["id"]))
        assert again.exit_code == 1
        assert "no live key" in again.output

        # Rotate at once: the old secret stops, the new one works for the same tenant and name.
        new_prod = secret_of(await run("rotate", str(keys["prod"]["id"])))
        assert await status(other) == 401
        assert await status(new_prod) == 200
        created = await client.post("/v1/conversations", json={"input": "hi"}, headers=bearer(new_prod))
        assert created.status_code == 201
        conversation = created.json()["conversation_id"]
        # The same tenant: globex's conversation is visible with the rotated key, not with acme's.
        assert (
            await client.get(f"/v1/conversations/{conversation}", headers=bearer(new_prod))
        ).status_code == 200
        assert (
            await client.get(f"/v1/conversations/{conversation}", headers=bearer(laptop))
        ).status_code == 404

        # Rotate with a grace period: both work until it ends; the new key keeps the expiry.
        new_laptop = secret_of(await run("rotate", str(keys["laptop"]["id"]), "--grace", "1h"))
        assert await status(laptop) == 200
        assert await status(new_laptop) == 200
        everything = records(await run("list", "--json", "--all"))
        statuses = sorted((str(r["status"]), str(r["name"])) for r in everything)
        assert statuses.count(("revoked", "prod")) == 1
        assert statuses.count(("live", "laptop")) == 2
        assert all(r["expires_at"] is not None for r in everything if r["name"] == "laptop")

        # Expired: the old laptop key's grace ends (moved into the past here) -> 401 key_expired.
        engine = create_engine(str(store["database_url"]))
        async with engine.begin() as connection:
            await connection.execute(
                update(ApiKey)
                .where(ApiKey.id == str(keys["laptop"]["id"]))
                .values(expires_at=utcnow() - timedelta(seconds=1))
            )
        await engine.dispose()
        expired = await client.get("/v1/conversations", headers=bearer(laptop))
        assert expired.status_code == 401
        assert expired.json()["code"] == "key_expired"
        # An expired key cannot be rotated (its successor would inherit a past expiry).
        stale = await run("rotate", str(keys["laptop"]["id"]))
        assert stale.exit_code == 1
        assert "has expired" in stale.output
        assert await status(new_laptop) == 200
        listing = listed(await run("list", "--json", "--tenant", "acme", "--all"))
        assert listing["ci"]["status"] == "revoked"


async def test_bad_key_commands_are_refused(run: Run) -> None:
    for args in (
        ("create", "--tenant", "acme", "--expires-in", "0"),
        ("create", "--tenant", "acme", "--expires-in", "soon"),
        ("create", "--tenant", "acme", "--expires-in", "-5m"),
        ("create", "--tenant", "acme", "--expires-in", "99999999d"),
        ("create", "--tenant", "acme", "--name", "x" * 65),
        ("create", "--tenant", "acme", "--name", "bad\nname"),
        ("create", "--tenant", "not a tenant"),
        ("rotate", "key_nope"),
        ("rotate", "key_nope", "--grace", "forever"),
        ("revoke", "key_nope"),
    ):
        result = await run(*args)
        assert result.exit_code != 0, (args, result.output)
        assert "sk-sabre-" not in result.output
    assert listed(await run("list", "--json", "--all")) == {}
