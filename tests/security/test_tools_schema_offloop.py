"""Large caller schemas are checked off the event loop.

Checking a schema against the 2020-12 meta-schema costs jsonschema ~0.3 ms a subschema, so a request
whose tools hold the most subschemas allowed (``MAX_REQUEST_SCHEMA_NODES``) took ~0.6 s of checking.
Done where the request is handled, that held the event loop every tenant's requests share; in the
schema-checking thread the loop keeps answering meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets

import httpx

from app.llm.scripted import ScriptedLLM
from app.tools import schema


def _tools(tag: str) -> list[dict[str, object]]:
    """Tools holding almost ``MAX_REQUEST_SCHEMA_NODES`` subschemas, new to the schema cache."""
    per_tool = 95
    count = (schema.MAX_REQUEST_SCHEMA_NODES - 50) // (per_tool + 2)
    return [
        {
            "type": "function",
            "name": f"t{i}",
            "parameters": {
                "type": "object",
                "description": f"{tag}-{i}",
                "properties": {f"p{j}": {"type": "string", "description": tag} for j in range(per_tool)},
            },
        }
        for i in range(count)
    ]


async def test_other_requests_are_answered_while_large_schemas_are_checked(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script("done")
    loop = asyncio.get_running_loop()
    began = loop.time()
    create = asyncio.create_task(
        client.post("/v1/conversations", json={"input": "hi", "tools": _tools(secrets.token_hex(8))})
    )
    answers: list[float] = [began]
    while not create.done():
        # The client calls the app in this process: a pause lets the loop run the request's task
        # (whose check, on the loop, would leave no room for this one meanwhile).
        await asyncio.sleep(0.005)
        health = await client.get("/healthz")
        assert health.status_code == 200
        if not create.done():
            answers.append(loop.time())
    created = await create
    took = loop.time() - began
    assert created.status_code == 201, created.text[:300]
    # The check takes hundreds of milliseconds and a health check about one. On the loop, the
    # health checks stopped for the whole check: one gap of most of the request's time. Compared
    # with the request's own time, not a count or a clock, so a loaded machine slows both alike.
    longest_gap = max(later - earlier for earlier, later in itertools.pairwise(answers))
    assert len(answers) > 2, took
    assert longest_gap < took / 3, (len(answers), longest_gap, took)
