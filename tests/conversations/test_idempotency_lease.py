"""An Idempotency-Key claim is a lease: renewed while its request runs, taken over soon after its
holder dies, and never applied twice (issue 11, item 8). On both stores, in process and with real
`sabre serve` processes, one of them SIGKILLed in the middle of a turn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.kit.clock import utcnow
from app.kit.idempotency import (
    IN_PROGRESS,
    Idempotency,
    IdempotencyClaimLost,
    IdempotencyInProgress,
    fingerprint,
)
from app.llm.scripted import Reply, ScriptedLLM
from app.models import IdempotencyRecord, Turn
from tests.conftest import AppFactory
from tests.conversations.test_bad_input import assert_problem

ROOT = Path(__file__).resolve().parents[2]


def tenant_and_key() -> tuple[str, str, dict[str, str]]:
    """A tenant of its own for the test, its API key and the header that sends it."""
    tenant = f"lease{secrets.token_hex(4)}"
    key = f"key-{secrets.token_hex(8)}"
    return tenant, key, {"Authorization": f"Bearer {key}"}


def sessionmaker_of(client: httpx.AsyncClient) -> async_sessionmaker[AsyncSession]:
    return client.app.state.sessionmaker  # type: ignore[attr-defined,no-any-return]


async def insert_claim(
    client: httpx.AsyncClient, *, tenant: str, key: str, body: bytes, **columns: Any
) -> None:
    """A claim as a request that died mid-work would have left it."""
    async with sessionmaker_of(client)() as session, session.begin():
        session.add(
            IdempotencyRecord(
                tenant=tenant,
                key=key,
                request_hash=fingerprint(method="POST", path="/v1/conversations", body=body),
                status_code=IN_PROGRESS,
                response={},
                **columns,
            )
        )


async def post_create(
    client: httpx.AsyncClient, body: bytes, *, key: str, auth: dict[str, str]
) -> httpx.Response:
    headers = {"Idempotency-Key": key, "Content-Type": "application/json", **auth}
    return await client.post("/v1/conversations", content=body, headers=headers)


async def wait_for(condition: Any, *, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_dead_holders_claim_is_taken_over(make_client: AppFactory, llm: ScriptedLLM) -> None:
    tenant, api_key, auth = tenant_and_key()
    body = json.dumps({"input": "hi"}).encode()
    now = utcnow()
    llm.script("one", "two")
    async with make_client(api_keys=f"{tenant}:{api_key}") as client:
        # Its lease ran out a second ago: the holder stopped renewing it.
        await insert_claim(
            client,
            tenant=tenant,
            key="expired",
            body=body,
            owner="dead-replica",
            created_at=now - timedelta(seconds=5),
            lease_expires_at=now - timedelta(seconds=1),
        )
        taken = await post_create(client, body, key="expired", auth=auth)
        assert taken.status_code == 201, taken.text
        again = await post_create(client, body, key="expired", auth=auth)
        assert again.status_code == 201
        assert again.headers.get("idempotent-replayed") == "true"
        assert again.json() == taken.json()

        # A claim written before leases existed counts as live for the old 15 minutes, then expires.
        await insert_claim(client, tenant=tenant, key="legacy-live", body=body, created_at=now)
        assert_problem(
            await post_create(client, body, key="legacy-live", auth=auth), 409, "idempotency_in_progress"
        )
        await insert_claim(
            client, tenant=tenant, key="legacy-old", body=body, created_at=now - timedelta(minutes=16)
        )
        assert (await post_create(client, body, key="legacy-old", auth=auth)).status_code == 201

        # A claim whose lease has not run out is a request still running.
        await insert_claim(
            client,
            tenant=tenant,
            key="live",
            body=body,
            owner="live-replica",
            created_at=now,
            lease_expires_at=now + timedelta(seconds=60),
        )
        assert_problem(await post_create(client, body, key="live", auth=auth), 409, "idempotency_in_progress")
    assert len(llm.requests) == 2


async def test_a_running_request_keeps_its_claim_past_the_lease(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    tenant, api_key, auth = tenant_and_key()
    body = json.dumps({"input": "take your time"}).encode()
    lease = 1.5  # renewed every 0.5 s: a loaded machine may delay a renewal by a second
    llm.script(Reply(text="slow answer", delay=3 * lease + 2))
    async with make_client(api_keys=f"{tenant}:{api_key}", lock_lease_seconds=lease) as client:
        first = asyncio.create_task(post_create(client, body, key="slow", auth=auth))
        await wait_for(lambda: len(llm.requests) == 1)
        started = time.monotonic()
        # Retries over three leases' time: the claim is renewed, so every one of them is refused.
        while True:
            retry = await post_create(client, body, key="slow", auth=auth)
            assert_problem(retry, 409, "idempotency_in_progress")
            if time.monotonic() - started > 3 * lease:
                break
            await asyncio.sleep(0.2)
        assert not first.done()
        done = await first
        assert done.status_code == 201, done.text
        assert done.json()["output"] == "slow answer"
        replay = await post_create(client, body, key="slow", auth=auth)
        assert replay.status_code == 201
        assert replay.headers.get("idempotent-replayed") == "true"
        assert replay.json() == done.json()
    assert len(llm.requests) == 1


async def test_a_stalled_original_cannot_overwrite_the_retry(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    """The original holder did not die but stalled past its lease (a long pause, a partition): a
    retry took the claim over and completed. The original's result must not be stored or applied."""
    tenant, api_key, auth = tenant_and_key()
    body = json.dumps({"input": "who wins?"}).encode()
    marker = secrets.token_hex(4)
    llm.script(Reply(text=f"original {marker}", delay=1.5), f"retry {marker}")
    async with make_client(api_keys=f"{tenant}:{api_key}") as client:
        original = asyncio.create_task(post_create(client, body, key="stall", auth=auth))
        await wait_for(lambda: len(llm.requests) == 1)
        # Stall the original: its lease ends now (it renews only every lease/3 = 40 s).
        async with sessionmaker_of(client)() as session, session.begin():
            await session.execute(
                update(IdempotencyRecord)
                .where(IdempotencyRecord.tenant == tenant, IdempotencyRecord.key == "stall")
                .values(lease_expires_at=utcnow() - timedelta(seconds=1))
            )
        retry = await post_create(client, body, key="stall", auth=auth)
        assert retry.status_code == 201, retry.text
        assert retry.json()["output"] == f"retry {marker}"
        late = await original
        assert_problem(late, 409, "idempotency_claim_lost")
        replay = await post_create(client, body, key="stall", auth=auth)
        assert replay.json() == retry.json()
        async with sessionmaker_of(client)() as session:
            outputs = (
                (await session.execute(select(Turn.output).where(Turn.output.like(f"% {marker}"))))
                .scalars()
                .all()
            )
        assert outputs == [f"retry {marker}"]  # the original's turn and conversation were rolled back


async def test_two_retries_cannot_both_take_over(client: httpx.AsyncClient) -> None:
    """Compare-and-set on the owner: of many concurrent retries of a dead claim, one wins."""
    tenant, key = f"cas{secrets.token_hex(4)}", "dead"
    now = utcnow()
    await insert_claim(
        client,
        tenant=tenant,
        key=key,
        body=b"{}",
        owner="dead-replica",
        created_at=now - timedelta(seconds=5),
        lease_expires_at=now - timedelta(seconds=1),
    )
    request_hash = fingerprint(method="POST", path="/v1/conversations", body=b"{}")
    retries = [
        Idempotency(sessionmaker=sessionmaker_of(client), tenant=tenant, key=key, request_hash=request_hash)
        for _ in range(6)
    ]
    outcomes = await asyncio.gather(*(r.begin() for r in retries), return_exceptions=True)
    winners = [r for r, outcome in zip(retries, outcomes, strict=True) if outcome is None]
    assert len(winners) == 1, outcomes
    assert all(isinstance(o, IdempotencyInProgress) for o in outcomes if o is not None), outcomes
    winner = winners[0]
    losers = [r for r in retries if r is not winner]
    # A loser holds nothing: it cannot renew, complete or remove the winner's claim.
    assert not await losers[0].renew()
    async with sessionmaker_of(client)() as session, session.begin():
        with pytest.raises(IdempotencyClaimLost):
            await losers[0].complete(session, status_code=201, body={"from": "loser"})
    await losers[1].abandon()
    assert await winner.renew()
    async with sessionmaker_of(client)() as session, session.begin():
        await winner.complete(session, status_code=201, body={"from": "winner"})
    stored = await Idempotency(
        sessionmaker=sessionmaker_of(client), tenant=tenant, key=key, request_hash=request_hash
    ).begin()
    assert stored is not None
    assert stored.body == {"from": "winner"}


# -- an operator's view: real server processes, one SIGKILLed mid-turn ------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


Server = asyncio.subprocess.Process


@contextlib.asynccontextmanager
async def processes() -> AsyncIterator[list[Server]]:
    """Server processes this test starts; each is killed with its process group at the end."""
    started: list[Server] = []
    try:
        yield started
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


def server_log(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:]


async def start(started: list[Server], env: dict[str, str], log: Path) -> tuple[Server, int]:
    """`sabre serve` started on a free port (its own process group); not waited for yet."""
    port = free_port()
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--port",
            str(port),
            env={**env, "SABRE_PORT": str(port)},
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started.append(process)
    return process, port


@contextlib.asynccontextmanager
async def ready(process: Server, port: int, log: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a server from `start`, once it answers /healthz."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        deadline = time.monotonic() + 60
        while True:
            assert process.returncode is None, server_log(log)
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/healthz")).status_code == 200:
                    break
            assert time.monotonic() < deadline, server_log(log)
            await asyncio.sleep(0.1)
        yield client


async def test_a_retry_succeeds_soon_after_the_server_is_killed(
    served_store: dict[str, str | None], llm: ScriptedLLM, tmp_path: Path
) -> None:
    """A resume-like message turn with an Idempotency-Key; its server is SIGKILLed in the middle of the
    model call. Against another server on the same store, the client's retries with the same key
    succeed once the dead request's lease runs out (seconds, not 15 minutes), and the message is
    applied once."""
    # The other server starts with the first, so it is up when the first is killed and its first
    # retries meet the live claim; not so short a lease that a renewal delayed on a loaded machine
    # lets the claim lapse before the kill.
    lease = 5.0
    tenant, api_key, auth = tenant_and_key()
    env = {name: value for name, value in os.environ.items() if not name.startswith("SABRE_")}
    env.update(
        {
            "SABRE_DATABASE_URL": str(served_store["database_url"]),
            "SABRE_DATA_DIR": str(tmp_path / "data"),
            "SABRE_API_KEYS": f"{tenant}:{api_key}",
            "SABRE_LOCK_LEASE_SECONDS": str(lease),
            "SABRE_LLM_API": "chat",
            "SABRE_MODEL": "scripted-model",
            "SABRE_RUNTIME_WORKERS": "1",
            "SABRE_RUNTIME_PRELOAD": "",
            "OPENAI_BASE_URL": llm.base_url,
            "OPENAI_API_KEY": "sk-test-secret-key",
        }
    )
    if served_store["redis_url"]:
        env["SABRE_REDIS_URL"] = served_store["redis_url"]
    log = tmp_path / "servers.log"
    message = {"input": "and now?"}
    key = {"Idempotency-Key": f"resume-{secrets.token_hex(4)}", **auth}
    llm.script("first answer", Reply(text="never sent", delay=120), "second answer")
    async with processes() as started:
        first, first_port = await start(started, env, log)
        second, second_port = await start(started, env, log)
        async with ready(second, second_port, log) as other:
            async with ready(first, first_port, log) as client:
                created = await client.post("/v1/conversations", json={"input": "hi"}, headers=auth)
                assert created.status_code == 201, created.text
                conversation = created.json()["conversation_id"]
                url = f"/v1/conversations/{conversation}/messages"
                in_flight = asyncio.create_task(client.post(url, json=message, headers=key))
                await wait_for(lambda: len(llm.requests) == 2, within=30)
                first.send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
                await first.wait()
                with pytest.raises(httpx.TransportError):
                    await in_flight
            refusals: list[str] = []
            while True:
                retry = await other.post(url, json=message, headers=key)
                if retry.status_code != 409:
                    break
                refusals.append(retry.json()["code"])
                assert time.monotonic() - killed_at < lease + 10, refusals
                await asyncio.sleep(0.2)
            waited = time.monotonic() - killed_at
            assert retry.status_code == 200, retry.text
            assert retry.json()["output"] == "second answer"
            # The dead request's claim (and turn lock) held until its lease ran out, renewed last at
            # most a third of a lease before the kill, and no longer: then the retry went through.
            assert set(refusals) <= {"idempotency_in_progress", "turn_in_progress"}, refusals
            assert lease * 2 / 3 - 0.5 < waited < lease + 10, (waited, refusals)
            replay = await other.post(url, json=message, headers=key)
            assert replay.headers.get("idempotent-replayed") == "true"
            assert replay.json() == retry.json()
            view = (await other.get(f"/v1/conversations/{conversation}", headers=auth)).json()
            assert view["version"] == 2
            transcript = (await other.get(f"{url}", headers=auth)).json()["data"]
            users = [m for m in transcript if m["role"] == "user"]
            assert len(users) == 2  # "hi" and one "and now?", not two
    assert len(llm.requests) == 3
