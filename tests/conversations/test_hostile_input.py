"""Hostile input: nothing a caller sends (or a model writes) may stall the server or turn into a 500.

A tool's JSON Schema runs its patterns on RE2, so a backtracking pattern cannot hold the event loop
(and every other tenant) hostage; bodies are RFC 8259 JSON of bounded depth; integers that reach the
store fit in 64 bits. Each test here failed before the fix it guards.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from app.llm.scripted import ScriptedLLM
from app.personas.models import CustomTool
from app.tools.registry import ToolDefinitionError, make_tool
from tests.conftest import AppFactory
from tests.conversations.test_bad_input import assert_problem
from tests.conversations.test_tenants import KEYS, bearer

A = bearer("key-acme-123")
B = bearer("key-globex-456")
EVIL_PATTERN = "^(a+)+$"  # Python's backtracking engine takes seconds on "a" * 26 + "!"


def tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": "A hostile tool.", "parameters": parameters}


LOOKUP = tool(
    "lookup",
    {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": EVIL_PATTERN}},
        "required": ["code"],
    },
)


def block(code: str) -> str:
    return f"<helpers>\n{code}\n</helpers>"


async def _latencies_while(
    task: asyncio.Task[httpx.Response], client: httpx.AsyncClient, paths: list[str]
) -> float:
    """The slowest answer to GETs of ``paths`` (as tenant B) while ``task`` runs: one is always in
    flight, so a stalled event loop shows up in one of them."""
    slowest = 0.0
    probes = 0
    while not task.done() or probes < 2:
        for path in paths:
            started = time.monotonic()
            response = await client.get(path, headers=B)
            slowest = max(slowest, time.monotonic() - started)
            assert response.status_code == 200, response.text
            probes += 1
    return slowest


@pytest.mark.timeout(120)
async def test_a_backtracking_pattern_does_not_stall_other_tenants(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    async with make_client(api_keys=KEYS) as client:
        llm.script("hello globex")
        created = await client.post("/v1/conversations", json={"input": "hi"}, headers=B)
        assert created.status_code == 201, created.text
        conv_b = created.json()["conversation_id"]

        llm.script(block('lookup(code="a" * 26 + "!")'), "The code does not fit.")
        task = asyncio.create_task(
            client.post("/v1/conversations", json={"input": "look it up", "tools": [LOOKUP]}, headers=A)
        )
        slowest = await _latencies_while(task, client, ["/readyz", f"/v1/conversations/{conv_b}"])
        turn = (await task).json()
        assert slowest < 1.0, f"tenant B waited {slowest:.2f} s while tenant A's argument was checked"
        # The model was told its argument does not match; the caller never saw the call.
        assert turn["status"] == "completed", turn
        assert turn["pending_tool_calls"] == []
        assert "does not match" in llm.requests[-1].all_text
        assert EVIL_PATTERN in llm.requests[-1].all_text

        # Far longer input is still linear: the answer comes back at once.
        llm.script(block('lookup(code="a" * 10_000 + "!")'), "Still does not fit.")
        started = time.monotonic()
        again = await client.post("/v1/conversations", json={"input": "again", "tools": [LOOKUP]}, headers=A)
        assert time.monotonic() - started < 10
        assert again.json()["status"] == "completed", again.text
        assert "does not match" in llm.requests[-1].all_text

        # A matching argument still pauses the turn for the caller.
        llm.script(block('lookup(code="aaa")'))
        paused = (
            await client.post("/v1/conversations", json={"input": "ok", "tools": [LOOKUP]}, headers=A)
        ).json()
        assert paused["status"] == "awaiting_tool_results"
        assert paused["pending_tool_calls"][0]["arguments"] == {"code": "aaa"}


def chained_all_of(levels: int) -> dict[str, Any]:
    """A 2 KB schema whose check takes 2**levels evaluations without a budget."""
    defs: dict[str, Any] = {
        f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(levels)
    }
    defs[f"d{levels}"] = {"type": "string"}
    return {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d0"}}}


COSTLY = {
    # Property names go through the same engine (additionalProperties consults patternProperties).
    "pattern_properties": (
        {
            "type": "object",
            "properties": {
                "options": {
                    "type": "object",
                    "patternProperties": {EVIL_PATTERN: {"type": "integer"}},
                    "additionalProperties": False,
                }
            },
        },
        'probe(options={"a" * 26 + "!": 1})',
        "not match any of the regexes",
    ),
    # jsonschema compares every pair of unhashable items: 3,000 objects took 13 s.
    "unique_items": (
        {"type": "object", "properties": {"rows": {"type": "array", "uniqueItems": True}}},
        'probe(rows=[{"i": i} for i in range(3_000)] + [{"i": 0}])',
        "has non-unique elements",
    ),
    # 2**30 evaluations: without the budget this never ends.
    "references": (chained_all_of(30), 'probe(x="s")', "too costly"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(COSTLY))
async def test_costly_schemas_do_not_stall_the_server(
    client: httpx.AsyncClient, llm: ScriptedLLM, case: str
) -> None:
    parameters, code, told = COSTLY[case]
    llm.script(block(code), "Understood.")
    task = asyncio.create_task(
        client.post("/v1/conversations", json={"input": "go", "tools": [tool("probe", parameters)]})
    )
    slowest = await _latencies_while(task, client, ["/readyz"])
    turn = (await task).json()
    assert slowest < 1.0, f"/readyz waited {slowest:.2f} s while the arguments were checked"
    assert turn["status"] == "completed", turn
    assert told in llm.requests[-1].all_text


async def test_references_never_leave_the_schema(
    client: httpx.AsyncClient, llm: ScriptedLLM, tmp_path: Path
) -> None:
    # jsonschema's default fetches any $ref URL (or file) it meets, blocking, while checking arguments.
    elsewhere = tmp_path / "schema.json"
    elsewhere.write_text('{"type": "integer"}')
    parameters = {"type": "object", "properties": {"x": {"$ref": elsewhere.as_uri()}}}
    llm.script(block('probe(x="text")'), "Understood.")
    turn = (
        await client.post("/v1/conversations", json={"input": "go", "tools": [tool("probe", parameters)]})
    ).json()
    assert turn["status"] == "completed", turn
    told = llm.requests[-1].all_text
    assert "unresolvable reference" in told
    assert "is not of type 'integer'" not in told  # the file was never read


@pytest.mark.parametrize(
    ("parameters", "fragments"),
    [
        # RE2 has no backreferences or lookaround: such a pattern is refused up front, never accepted
        # silently (nor run on Python's re).
        (
            {"type": "object", "properties": {"x": {"type": "string", "pattern": "(a)\\1"}}},
            ["(a)\\\\1", "RE2", "backreferences", "properties/x/pattern"],
        ),
        ({"type": "object", "properties": {"x": {"type": "string", "pattern": "(?=a)b"}}}, ["(?=a)b", "RE2"]),
        ({"type": "object", "patternProperties": {"(?<!x)y": {}}}, ["(?<!x)y", "RE2"]),
        # A nested $schema would hand that subschema to jsonschema's own class (and Python's re).
        (
            {
                "type": "object",
                "properties": {
                    "x": {"$schema": "http://json-schema.org/draft-07/schema#", "pattern": EVIL_PATTERN}
                },
            },
            ["$schema", "properties/x"],
        ),
        (
            {"type": "object", "patternProperties": {"^a": {}}, "unevaluatedProperties": False},
            ["unevaluatedProperties", "patternProperties"],
        ),
    ],
)
async def test_schemas_that_cannot_be_applied_safely_are_422(
    client: httpx.AsyncClient, llm: ScriptedLLM, parameters: dict[str, Any], fragments: list[str]
) -> None:
    # Encoded here: httpx refuses a lone surrogate, which json.dumps escapes.
    body = json.dumps({"input": "hi", "tools": [tool("odd", parameters)]})
    response = await client.post(
        "/v1/conversations", content=body, headers={"content-type": "application/json"}
    )
    problem = assert_problem(response, 422, "invalid_tool")
    detail = str(problem["detail"])
    assert detail.startswith("tools.0: tool 'odd': parameters: "), detail
    for fragment in fragments:
        assert fragment in detail
    assert llm.requests == []


def test_a_persona_tool_with_a_backreference_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"backreference|\(a\)\\\\1"):
        CustomTool(
            name="odd",
            description="x",
            execution_mode="external",
            parameters={"type": "object", "properties": {"x": {"type": "string", "pattern": "(a)\\1"}}},
        )


def nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return {"type": "object", "properties": {"x": schema}}


@pytest.mark.parametrize("levels", [150, 300])
async def test_a_deeply_nested_schema_is_422(
    client: httpx.AsyncClient, llm: ScriptedLLM, levels: int
) -> None:
    response = await client.post(
        "/v1/conversations", json={"input": "hi", "tools": [tool("deep", nested_schema(levels))]}
    )
    problem = assert_problem(response, 422, "validation_error")
    detail = str(problem["detail"])
    assert "64 levels" in detail
    assert "tools.0.parameters.properties.x" in detail  # where it went too deep
    assert llm.requests == []


async def test_any_deeply_nested_body_is_422(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    deep = b"[" * 5_000 + b'"leaf"' + b"]" * 5_000  # deeper than Python's recursion limit
    headers = {"content-type": "application/json"}
    for body in (
        b'{"input": "hi", "metadata": {"a": ' + deep + b"}}",
        b'{"input": "hi", "tools": [' + deep + b"]}",
        b'{"input": "hi", "metadata": {"a": ' + b"[" * 70 + b"]" * 70 + b"}}",  # parses, but too deep
    ):
        response = await client.post("/v1/conversations", content=body, headers=headers)
        problem = assert_problem(response, 422, "validation_error")
        assert "64 levels" in str(problem["detail"])
    assert llm.requests == []


async def test_a_schema_at_the_depth_limit_works(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    # body > tools > tool > parameters > properties > x > … : 29 levels of objects reach depth 64.
    levels = 29
    llm.script(block(f"v = 'leaf'\nfor _ in range({levels}):\n    v = {{'x': v}}\ndeep(x=v)"))
    response = await client.post(
        "/v1/conversations", json={"input": "hi", "tools": [tool("deep", nested_schema(levels))]}
    )
    assert response.status_code == 201, response.text
    turn = response.json()
    assert turn["status"] == "awaiting_tool_results", turn
    one_deeper = await client.post(
        "/v1/conversations", json={"input": "hi", "tools": [tool("deep", nested_schema(levels + 1))]}
    )
    assert_problem(one_deeper, 422, "validation_error")


def test_deep_schemas_are_refused_where_they_are_defined() -> None:
    with pytest.raises(ToolDefinitionError, match="64 levels"):
        make_tool(name="deep", description="", parameters=nested_schema(40))
    with pytest.raises(ValidationError, match="64 levels"):
        CustomTool(name="deep", description="x", execution_mode="external", parameters=nested_schema(40))


@pytest.mark.parametrize("after", [2**31, 2**63, 10**30, -(2**63) - 1])
async def test_out_of_range_integers_in_a_query_are_422(
    client: httpx.AsyncClient, llm: ScriptedLLM, after: int
) -> None:
    llm.script("hello")
    conv = (await client.post("/v1/conversations", json={"input": "hi"})).json()["conversation_id"]
    problem = assert_problem(
        await client.get(f"/v1/conversations/{conv}/messages", params={"after": after}),
        422,
        "validation_error",
    )
    assert "after" in str(problem["detail"])
    # The largest accepted value is an empty page, not an overflow.
    last = await client.get(f"/v1/conversations/{conv}/messages", params={"after": 2**31 - 1})
    assert last.status_code == 200, last.text
    assert last.json()["data"] == []


async def test_out_of_range_integers_in_metadata_are_422(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    # Floats too: the schema cannot tell 1e19 from 10**19, so every number keeps to the one range.
    for value in (2**63, -(2**63) - 1, 10**30, 1e19, -1e19, float(2**63)):
        body = {"input": "hi", "metadata": {"n": value}}
        problem = assert_problem(await client.post("/v1/conversations", json=body), 422, "validation_error")
        assert "metadata" in str(problem["detail"])
    assert llm.requests == []


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999"])
async def test_non_finite_numbers_are_422(client: httpx.AsyncClient, llm: ScriptedLLM, token: bytes) -> None:
    headers = {"content-type": "application/json"}
    body = b'{"input": "hi", "metadata": {"score": ' + token + b"}}"
    problem = assert_problem(
        await client.post("/v1/conversations", content=body, headers=headers), 422, "validation_error"
    )
    assert "RFC 8259" in str(problem["detail"])
    # The same anywhere in any body, e.g. inside a tool's schema.
    schema = b'{"type": "object", "properties": {"n": {"type": "number", "maximum": ' + token + b"}}}"
    body = b'{"input": "hi", "tools": [{"type": "function", "name": "t", "parameters": ' + schema + b"}]}"
    assert_problem(
        await client.post("/v1/conversations", content=body, headers=headers), 422, "validation_error"
    )
    assert llm.requests == []


async def test_non_finite_tool_output_is_422(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script(block("print(lookup(code='aaa'))"), "done")
    turn = (await client.post("/v1/conversations", json={"input": "go", "tools": [LOOKUP]})).json()
    call = turn["pending_tool_calls"][0]["id"]
    url = f"/v1/conversations/{turn['conversation_id']}/tool-results"
    body = b'{"results": [{"tool_call_id": "' + call.encode() + b'", "output": [1, NaN]}]}'
    response = await client.post(url, content=body, headers={"content-type": "application/json"})
    assert_problem(response, 422, "validation_error")
    # Nothing was consumed: the call is still pending and a proper answer resumes it.
    done = await client.post(url, json={"results": [{"tool_call_id": call, "output": [1, 2.5]}]})
    assert done.json()["status"] == "completed", done.text


async def test_malformed_json_is_still_400(client: httpx.AsyncClient) -> None:
    headers = {"content-type": "application/json"}
    for body in (b'{"input": "hi",', b'{"input": "\xff\xfe"}', b"nan"):
        response = await client.post("/v1/conversations", content=body, headers=headers)
        assert response.status_code in (400, 422), response.text
        assert response.headers["content-type"].startswith("application/problem+json")
