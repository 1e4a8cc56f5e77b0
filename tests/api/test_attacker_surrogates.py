"""Lone surrogates in request bodies are a 422 on both stores. JSON can carry half a UTF-16 pair
(``"\\ud800"``, or its raw UTF-8 bytes), which ``json`` decodes as is and no UTF-8 encoder takes:
before, such an input or metadata value was stored, then every answer that carried it was a 500
(GET of the conversation or its messages, and the listing of every conversation of the tenant) and
the turn's request to the model could not be sent (found by the attacker pass)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from app.kit.db import create_engine, create_sessionmaker
from app.kit.errors import Unprocessable
from app.kit.json_body import loads
from app.kit.migrate import upgrade
from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory
from tests.conversations.rows import conversation_row

JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"input": "hi \\ud800 there"}', "input"),
        (b'{"input": "hi \\uDC00"}', "input"),
        (b'{"input": "hi \xed\xa0\x80"}', "input"),  # the surrogate's own UTF-8 bytes
        (b'{"input": "hi", "metadata": {"k": "\\udfff"}}', "metadata.k"),
        (b'{"input": "hi", "metadata": {"\\ud800": "v"}}', "metadata.\\ud800"),
        (b'{"input": "hi", "instructions": "\\ude00\\ud83d"}', "instructions"),  # a pair the wrong way round
        (b'{"input": "hi", "messages": [{"role": "user", "content": "\\ud800"}]}', "messages.0.content"),
    ],
)
async def test_a_lone_surrogate_is_refused(
    make_client: AppFactory, llm: ScriptedLLM, body: bytes, where: str
) -> None:
    async with make_client() as client:
        response = await client.post("/v1/conversations", content=body, headers=JSON)
        assert response.status_code == 422, response.text
        problem = response.json()
        assert problem["detail"].startswith(f"{where}: not valid Unicode"), problem
        assert problem["errors"][0]["type"] == "string_unicode"
        listed = await client.get("/v1/conversations")
        assert listed.status_code == 200, listed.text
    assert llm.requests == []


async def test_a_lone_surrogate_in_a_later_request_leaves_the_conversation_usable(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    llm.script("<helpers>\nprint(lookup())\n</helpers>", "done")
    async with make_client() as client:
        created = await client.post("/v1/conversations", json={"input": "hi", "tools": [tool]})
        turn = created.json()
        assert turn["status"] == "awaiting_tool_results", turn
        conv, call = turn["conversation_id"], turn["pending_tool_calls"][0]["id"]
        bad = b'{"results": [{"tool_call_id": "%s", "output": {"name": "\\udbff"}}]}' % call.encode()
        response = await client.post(f"/v1/conversations/{conv}/tool-results", content=bad, headers=JSON)
        assert response.status_code == 422, response.text
        patch = await client.patch(f"/v1/conversations/{conv}", content=b'{"metadata": {"a": "\\ud800"}}')
        assert patch.status_code == 422, patch.text
        good = {"results": [{"tool_call_id": call, "output": {"name": "\U0001f600"}}]}
        resumed = await client.post(f"/v1/conversations/{conv}/tool-results", json=good)
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["status"] == "completed"
        for path in ("", "/messages"):
            assert (await client.get(f"/v1/conversations/{conv}{path}")).status_code == 200


async def test_chat_completions_refuse_a_lone_surrogate_even_inside_a_json_string(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    async with make_client() as client:
        for content in (b'"\\ud800"', b'"{\\"a\\": \\"\\\\ud800\\"}"'):  # plain, and in a tool's JSON
            body = (
                b'{"model": "sabre/default", "messages": [{"role": "user", "content": "hi"}, '
                b'{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", '
                b'"function": {"name": "t", "arguments": "{}"}}]}, '
                b'{"role": "tool", "tool_call_id": "c1", "content": ' + content + b"}]}"
            )
            response = await client.post("/v1/chat/completions", content=body, headers=JSON)
            assert response.status_code == 422, response.text
            assert "not valid Unicode" in response.json()["detail"], response.text
    assert llm.requests == []


def test_loads_keeps_pairs_and_refuses_halves() -> None:
    assert loads(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}
    assert loads('{"a": "\U0001f600"}'.encode()) == {"a": "\U0001f600"}
    assert loads(b'{"a": "\\\\ud800"}') == {"a": "\\ud800"}  # an escaped backslash: text
    for body in (b'{"a": "\\ud83d"}', b'["\\ude00"]', b'{"a": "\xed\xb0\x80"}', '["\ud800"]'):
        with pytest.raises(Unprocessable):
            loads(body)


async def test_a_tool_pattern_that_is_half_a_pair_is_refused_with_the_body(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    # Was invalid_tool from the schema check (test_hostile_input); the body's check comes first now.
    tool = (
        b'{"type": "function", "name": "odd", "parameters": {"type": "object", '
        b'"properties": {"x": {"type": "string", "pattern": "\\ud800"}}}}'
    )
    async with make_client() as client:
        body = b'{"input": "hi", "tools": [' + tool + b"]}"
        response = await client.post("/v1/conversations", content=body, headers=JSON)
        assert response.status_code == 422, response.text
        assert response.json()["detail"].startswith(
            "tools.0.parameters.properties.x.pattern: not valid Unicode"
        )


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32"])
async def test_bodies_in_utf16_or_utf32_are_checked_alike(
    make_client: AppFactory, llm: ScriptedLLM, encoding: str
) -> None:
    # json reads UTF-16 and UTF-32 bodies too, where each escape's characters are spread over zero
    # bytes: the byte searches for a NUL's and a surrogate's escape missed them, and both were stored.
    llm.script("hello")
    async with make_client() as client:
        for text, kind in (
            ('{"input": "a\\u0000b"}', "string_nul"),
            ('{"input": "a\\ud800b"}', "string_unicode"),
        ):
            response = await client.post("/v1/conversations", content=text.encode(encoding), headers=JSON)
            assert response.status_code == 422, response.text
            assert response.json()["errors"][0]["type"] == kind
        assert llm.requests == []
        fine = await client.post(
            "/v1/conversations", content='{"input": "h\\u00e9"}'.encode(encoding), headers=JSON
        )
        assert fine.status_code == 201, fine.text
        assert fine.json()["status"] == "completed"


async def test_rows_stored_before_the_refusal_are_served_mended(
    make_client: AppFactory, llm: ScriptedLLM, store: dict[str, str | None]
) -> None:
    """A lone surrogate already in a stored row (from before the refusal: plain JSON columns take
    the escape on both stores) made the conversation, its messages and every listing of its
    tenant a 500, and its next turn fail. Read from the store, it is U+FFFD."""
    llm.script("first answer")
    async with make_client() as client:
        created = await client.post("/v1/conversations", json={"input": "hi", "metadata": {"k": "v"}})
        conv = created.json()["conversation_id"]
        assert store["database_url"] is not None
        engine = create_engine(store["database_url"])
        try:
            async with engine.begin() as connection:
                await connection.execute(
                    text("UPDATE conversations SET metadata = :metadata WHERE id = :id"),
                    {"metadata": '{"k": "a\\ud800b", "\\udc00": "\\ud83d\\ude00"}', "id": conv},
                )
                await connection.execute(
                    text("UPDATE messages SET parts = :parts WHERE conversation_id = :id AND role = 'user'"),
                    {"parts": '[{"kind": "text", "text": "hi \\uDBFF"}]', "id": conv},
                )
        finally:
            await engine.dispose()
        got = await client.get(f"/v1/conversations/{conv}")
        assert got.status_code == 200, got.text
        assert got.json()["metadata"] == {"k": "a\ufffdb", "\ufffd": "\U0001f600"}  # a pair stays
        listed = await client.get("/v1/conversations")
        assert listed.status_code == 200, listed.text
        assert conv in [item["id"] for item in listed.json()["data"]]
        messages = await client.get(f"/v1/conversations/{conv}/messages")
        assert messages.status_code == 200, messages.text
        assert "hi \ufffd" in str(messages.json())
        llm.script("second answer")
        turn = await client.post(f"/v1/conversations/{conv}/messages", json={"input": "more"})
        assert turn.status_code == 200, turn.text
        assert turn.json()["status"] == "completed", turn.json()
        assert "hi \ufffd" in str(llm.requests[-1])
        # Gone with it: the session's store is shared, and its other tests list this tenant.
        assert (await client.delete(f"/v1/conversations/{conv}")).status_code == 204


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store of this test's own (the migration rewrites rows: not the session's shared one);
    SQLite's is not migrated yet."""
    if request.param == "postgres":
        return "postgresql+asyncpg://" + str(request.getfixturevalue("own_postgres_url")).split("://", 1)[1]
    return f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"


async def test_the_migration_mends_stored_metadata(fresh_store: str) -> None:
    """On PostgreSQL a stored lone surrogate in metadata failed every listing of the tenant with a
    metadata filter inside the query itself (its JSON operators refuse the escape), where no
    mending on read reaches: migration 0008 mends the rows (U+FFFD; a pair stays)."""
    url = fresh_store
    postgres = url.startswith("postgresql")
    await upgrade(url)
    engine = create_engine(url)
    rows = conversation_row("t"), conversation_row("t")
    try:
        async with create_sessionmaker(engine)() as session:
            session.add_all(rows)
            await session.commit()
        async with engine.begin() as connection:
            stored = ['{"k": "a\\ud800b", "\\udc00": "\\ud83d\\ude00"}', '{"k": "\\ud83d\\ude00 fine"}']
            for row, metadata in zip(rows, stored, strict=True):
                await connection.execute(
                    text("UPDATE conversations SET metadata = :metadata WHERE id = :id"),
                    {"metadata": metadata, "id": row.id},
                )
            await connection.execute(text("UPDATE alembic_version SET version_num = '0007'"))
        await upgrade(url, revision="0008")
        async with engine.connect() as connection:
            raw = dict(
                (await connection.execute(text("SELECT id, metadata FROM conversations ORDER BY id"))).all()
            )
            found = (await connection.execute(text("SELECT version_num FROM alembic_version"))).scalar_one()
        assert found == "0008"
        values = {key: json.loads(value) if isinstance(value, str) else value for key, value in raw.items()}
        assert values[rows[0].id] == {"k": "a\ufffdb", "\ufffd": "\U0001f600"}
        assert values[rows[1].id] == {"k": "\U0001f600 fine"}
        if postgres:  # what failed: the metadata filter of a listing, in the query
            async with engine.connect() as connection:
                matched = await connection.execute(
                    text("SELECT id FROM conversations WHERE metadata ->> 'k' = :k"), {"k": "a\ufffdb"}
                )
                assert [row[0] for row in matched] == [rows[0].id]
    finally:
        await engine.dispose()
