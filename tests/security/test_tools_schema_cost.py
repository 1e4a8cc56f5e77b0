"""Caller tool schemas whose meta-schema check would hold the event loop: refused up front.

jsonschema checks a schema against the 2020-12 meta-schema at about 0.3 ms per subschema (its
dynamic references), synchronously where the request is handled. An 80 KB ``{"allOf": [{}, …]}``
took 5-6 s of the loop every tenant shares, and a 2 MB body over two minutes.
"""

from __future__ import annotations

import time

import httpx
import pytest

from app.llm.scripted import ScriptedLLM
from app.tools import schema


def _tool(name: str, parameters: dict[str, object]) -> dict[str, object]:
    return {"type": "function", "name": name, "parameters": parameters}


async def test_a_schema_of_many_subschemas_is_422_at_once(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script("done")
    wide = {"type": "object", "allOf": [{} for _ in range(20_000)]}
    started = time.perf_counter()
    created = await client.post("/v1/conversations", json={"input": "hi", "tools": [_tool("wide", wide)]})
    elapsed = time.perf_counter() - started
    assert created.status_code == 422, created.text[:300]
    assert created.json()["code"] == "invalid_tool"
    assert "objects and arrays" in created.json()["detail"]
    assert elapsed < 2, elapsed
    assert llm.requests == []


async def test_many_tools_together_are_bounded_too(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    # Each under the per-schema cap, 128 of them (the most a request may declare): 5-6 s before.
    llm.script("done")
    tools = [
        _tool(f"t{i}", {"type": "object", "allOf": [{"minimum": i}] * 150, "properties": {"x": {}}})
        for i in range(128)
    ]
    started = time.perf_counter()
    created = await client.post("/v1/conversations", json={"input": "hi", "tools": tools})
    elapsed = time.perf_counter() - started
    assert created.status_code == 422, created.text[:300]
    assert "together" in created.json()["detail"]
    assert elapsed < 2, elapsed


async def test_ordinary_tools_still_work(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    properties = {f"p{i}": {"type": "array", "items": {"type": "string"}} for i in range(100)}
    tools = [_tool(f"t{i}", {"type": "object", "properties": properties}) for i in range(6)]
    llm.script("<helpers>\nprint(6 * 7)\n</helpers>", "done")
    created = await client.post("/v1/conversations", json={"input": "hi", "tools": tools})
    assert created.status_code == 201, created.text[:300]
    assert created.json()["status"] == "completed"


def test_the_per_schema_cap_applies_wherever_a_schema_is_compiled() -> None:
    cap = schema.MAX_SCHEMA_NODES
    assert cap <= schema.MAX_REQUEST_SCHEMA_NODES
    at_cap = {"type": "object", "allOf": [{} for _ in range(cap - 2)]}
    schema.compile_schema(at_cap)
    with pytest.raises(schema.SchemaProblem, match=f"more than {cap} objects and arrays"):
        schema.compile_schema({**at_cap, "allOf": [*at_cap["allOf"], {}]})  # type: ignore[list-item]
