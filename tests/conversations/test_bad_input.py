"""Every bad request is a 4xx problem+json with a clear detail: never a 500, never a traceback."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy import text

from app.config import Settings
from app.kit.db import create_engine
from app.llm.scripted import ScriptedLLM
from app.main import StartupError, create_app
from tests.conftest import AppFactory


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    assert body["code"] == code, body
    assert body["detail"]
    assert "Traceback" not in response.text
    return body  # type: ignore[no-any-return]


async def test_malformed_json(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/conversations",
        content=b'{"input": "hi",',
        headers={"content-type": "application/json"},
    )
    assert_problem(response, 400, "invalid_json")


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"input": 5}, "input"),
        ({"input": ["a"]}, "input"),
        ({}, "input"),
        ({"input": ""}, "input"),
        ({"input": "   \n"}, "input"),
        ({"input": "hi", "max_iterations": 0}, "max_iterations"),
        ({"input": "hi", "max_iterations": "many"}, "max_iterations"),
        ({"input": "hi", "metadata": {"a": {"nested": 1}}}, "metadata"),
        ({"input": "hi", "surprise": True}, "surprise"),
    ],
)
async def test_invalid_bodies(client: httpx.AsyncClient, body: dict[str, object], where: str) -> None:
    problem = assert_problem(await client.post("/v1/conversations", json=body), 422, "validation_error")
    assert where in str(problem["detail"])
    assert problem["errors"]


async def test_body_that_is_not_an_object(client: httpx.AsyncClient) -> None:
    assert_problem(await client.post("/v1/conversations", json=["input"]), 422, "validation_error")


async def test_unknown_persona_lists_the_names(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    problem = assert_problem(
        await client.post("/v1/conversations", json={"input": "hi", "persona": "pirate"}),
        422,
        "unknown_persona",
    )
    assert "default" in str(problem["detail"])
    assert llm.requests == []


async def test_oversized_input(make_client: AppFactory, llm: ScriptedLLM) -> None:
    async with make_client(max_input_chars=50, max_body_bytes=4096) as client:
        problem = assert_problem(
            await client.post("/v1/conversations", json={"input": "x" * 51}),
            413,
            "payload_too_large",
        )
        assert "50" in str(problem["detail"])
        assert_problem(
            await client.post("/v1/conversations", json={"input": "x" * 10_000}),
            413,
            "payload_too_large",
        )
    assert llm.requests == []


async def test_unknown_ids_and_routes(client: httpx.AsyncClient) -> None:
    for response in (
        await client.get("/v1/conversations/conv_nope"),
        await client.get("/v1/conversations/conv_nope/messages"),
        await client.post("/v1/conversations/conv_nope/messages", json={"input": "x"}),
        await client.delete("/v1/conversations/conv_nope"),
        await client.get("/v1/nothing-here"),
    ):
        assert_problem(response, 404, "not_found")
    assert_problem(await client.put("/v1/conversations", json={}), 405, "method_not_allowed")


async def test_deleted_conversation_is_gone(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script("hello")
    conv = (await client.post("/v1/conversations", json={"input": "hi"})).json()["conversation_id"]
    deleted = await client.delete(f"/v1/conversations/{conv}")
    assert deleted.status_code == 204
    assert_problem(
        await client.post(f"/v1/conversations/{conv}/messages", json={"input": "still there?"}),
        404,
        "not_found",
    )
    assert_problem(await client.get(f"/v1/conversations/{conv}/messages"), 404, "not_found")
    assert_problem(await client.delete(f"/v1/conversations/{conv}"), 404, "not_found")


async def test_bad_pagination(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script("hello")
    conv = (await client.post("/v1/conversations", json={"input": "hi"})).json()["conversation_id"]
    assert_problem(await client.get(f"/v1/conversations/{conv}/messages?limit=0"), 422, "validation_error")
    assert_problem(await client.get(f"/v1/conversations/{conv}/messages?after=abc"), 422, "validation_error")
    page = (await client.get(f"/v1/conversations/{conv}/messages?limit=1")).json()
    assert page["has_more"] is True
    assert page["next_after"] == 0
    rest = (await client.get(f"/v1/conversations/{conv}/messages?after=0")).json()
    assert [m["seq"] for m in rest["data"]] == [1]


async def test_open_mode_refuses_a_public_address(tmp_path: object) -> None:
    app = create_app(
        Settings(host="0.0.0.0", database_url=None, data_dir=tmp_path, runtime_preload="")  # type: ignore[arg-type]
    )
    with pytest.raises(StartupError, match="loopback"):
        async with app.router.lifespan_context(app):
            pass


async def test_a_delete_holds_the_turn_lock_while_it_deletes(
    make_client: AppFactory, llm: ScriptedLLM, store: dict[str, str | None]
) -> None:
    """A turn that starts while its conversation is being deleted gets 409, and the deletion
    completes. Before, the DELETE only checked that no turn held the lock: a turn starting in
    between stored itself against rows being deleted, and failed (a 500) once they were gone.
    The deletion is held in the middle by another connection that has the conversation's row."""
    if store["redis_url"] is None:
        pytest.skip("SQLite: one writer at a time, so a turn never stores itself beside a deletion")
    llm.script("hello")
    async with make_client() as client:
        conv = (await client.post("/v1/conversations", json={"input": "hi"})).json()["conversation_id"]
        locks = client.app.state.locks  # type: ignore[attr-defined]
        engine = create_engine(str(store["database_url"]))
        try:
            async with engine.connect() as blocker:
                # Holds the conversation's row until rolled back.
                await blocker.execute(
                    text("UPDATE conversations SET version = version WHERE id = :id"), {"id": conv}
                )
                deleting = asyncio.ensure_future(client.delete(f"/v1/conversations/{conv}"))
                for _ in range(500):
                    holder = await locks.holder(conv)
                    if holder is not None or deleting.done():
                        break
                    await asyncio.sleep(0.01)
                assert not deleting.done(), deleting.result().text
                assert holder is not None
                assert holder.startswith("delete_")
                started = await asyncio.wait_for(
                    client.post(f"/v1/conversations/{conv}/messages", json={"input": "now?"}), timeout=20
                )
                assert_problem(started, 409, "turn_in_progress")
                assert started.json()["detail"] == "This conversation is being deleted."
                await blocker.rollback()
            deleted = await asyncio.wait_for(deleting, timeout=40)
        finally:
            await engine.dispose()
        assert deleted.status_code == 204, deleted.text
        assert await locks.holder(conv) is None
        assert_problem(await client.get(f"/v1/conversations/{conv}"), 404, "not_found")
