"""Caller tools named like what a block's namespace holds: a 422 up front, or a turn that works."""

from __future__ import annotations

import httpx
import pytest

from app.llm.scripted import ScriptedLLM


@pytest.mark.parametrize("name", ["__builtins__", "__import__", "__name__", "__x", "__"])
async def test_a_tool_name_starting_with_two_underscores_is_422(
    client: httpx.AsyncClient, llm: ScriptedLLM, name: str
) -> None:
    # Accepted before, stored with the conversation, and then every block of it failed in the
    # runtime's own name check: each turn an internal_error with a turn_crashed traceback logged.
    tool = {"type": "function", "name": name, "parameters": {"type": "object"}}
    llm.script("<helpers>\nprint(6 * 7)\n</helpers>", "done")
    created = await client.post("/v1/conversations", json={"input": "hi", "tools": [tool]})
    assert created.status_code == 422, created.text
    assert created.json()["code"] == "invalid_tool"
    assert llm.requests == []
    ok = (await client.post("/v1/conversations", json={"input": "hi"})).json()
    assert ok["status"] == "completed", ok
    later = await client.post(
        f"/v1/conversations/{ok['conversation_id']}/messages", json={"input": "x", "tools": [tool]}
    )
    assert later.status_code == 422, later.text
    chat = await client.post(
        "/v1/chat/completions",
        json={"model": "sabre/default", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]},
    )
    assert chat.status_code == 422, chat.text


@pytest.mark.parametrize("name", ["_", "_private", "len", "Exception", "globals", "json", "str"])
async def test_a_tool_named_like_a_builtin_shadows_it_in_blocks_only(
    client: httpx.AsyncClient, llm: ScriptedLLM, name: str
) -> None:
    tool = {"type": "function", "name": name, "parameters": {"type": "object"}}
    llm.script("<helpers>\nx = 40 + 2\nprint(x)\n</helpers>", "done", "<helpers>\nprint(x)\n</helpers>", "ok")
    turn = (await client.post("/v1/conversations", json={"input": "hi", "tools": [tool]})).json()
    assert turn["status"] == "completed", turn
    assert "42" in llm.requests[1].all_text
    nxt = await client.post(f"/v1/conversations/{turn['conversation_id']}/messages", json={"input": "again"})
    assert nxt.json()["status"] == "completed", nxt.text
    assert "42" in llm.requests[3].all_text


async def test_a_tool_parameter_with_an_empty_name_is_422(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    # The same class of crash: the runtime refuses an empty parameter name for an external tool, so
    # every block of a conversation declaring one failed as an internal_error.
    parameters = {"type": "object", "properties": {"": {"type": "string"}}}
    tool = {"type": "function", "name": "look", "parameters": parameters}
    llm.script("<helpers>\nprint(6 * 7)\n</helpers>", "done")
    created = await client.post("/v1/conversations", json={"input": "hi", "tools": [tool]})
    assert created.status_code == 422, created.text
    assert "cannot be empty" in created.json()["detail"]
    odd = {"type": "object", "properties": {"a b": {"type": "string"}, "class": {}, "é": {}}}
    fine = await client.post(
        "/v1/conversations", json={"input": "hi", "tools": [{**tool, "parameters": odd}]}
    )
    assert fine.json()["status"] == "completed", fine.text
