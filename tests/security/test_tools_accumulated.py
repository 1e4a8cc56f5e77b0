"""A conversation's external tools stay within what one request may declare, however many messages
add to them.

Each message may declare up to 128 tools, merged into the conversation's by name: before, new names
with every message grew the stored set without bound, and every later turn rendered all of them into
the prompt and checked every schema (the per-request bounds of test_tools_schema_cost did not hold
across messages).
"""

from __future__ import annotations

import httpx

from app.llm.scripted import ScriptedLLM


def _tools(prefix: str, count: int) -> list[dict[str, object]]:
    parameters = {"type": "object", "properties": {"x": {"type": "string"}}}
    return [{"type": "function", "name": f"{prefix}{i}", "parameters": parameters} for i in range(count)]


async def test_tools_added_message_by_message_are_bounded(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script("one", "two", "three")
    created = (await client.post("/v1/conversations", json={"input": "hi", "tools": _tools("a", 100)})).json()
    assert created["status"] == "completed", created
    conv = created["conversation_id"]
    more = await client.post(
        f"/v1/conversations/{conv}/messages", json={"input": "x", "tools": _tools("b", 100)}
    )
    assert more.status_code == 422, more.text[:300]
    assert more.json()["code"] == "invalid_tool"
    assert "limit is 128" in more.json()["detail"]
    # Replacing tools by name, and adding within the limit, still work.
    same = await client.post(
        f"/v1/conversations/{conv}/messages", json={"input": "y", "tools": _tools("a", 100)}
    )
    assert same.json()["status"] == "completed", same.text[:300]
    few = await client.post(
        f"/v1/conversations/{conv}/messages", json={"input": "z", "tools": _tools("c", 28)}
    )
    assert few.json()["status"] == "completed", few.text[:300]
