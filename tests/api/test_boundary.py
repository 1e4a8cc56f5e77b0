"""What the spec says of a body is checked with the body, before any state: a tool name that is not an
(ASCII) identifier, a boolean or an integer given as something else, are a 422 validation_error, not
a 412 for a stale If-Match nor a quiet coercion (found by schemathesis)."""

from __future__ import annotations

from typing import Any

import pytest

from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (
            {"input": "x", "tools": [{"type": "function", "name": "not an identifier"}]},
            "tools.0.responses.name",
        ),
        (
            {"input": "x", "tools": [{"type": "function", "function": {"name": "café"}}]},
            "tools.0.chat.function.name",
        ),
        ({"input": "x", "stream": 0}, "stream"),
        ({"input": "x", "background": "false"}, "background"),
        (
            {"input": "x", "tools": [{"type": "function", "name": "t", "strict": 1}]},
            "tools.0.responses.strict",
        ),
    ],
)
async def test_the_body_is_checked_before_the_version(
    make_client: AppFactory, llm: ScriptedLLM, body: dict[str, Any], where: str
) -> None:
    llm.script("Hello.")
    async with make_client() as client:
        created = await client.post("/v1/conversations", json={"input": "hi"})
        path = f"/v1/conversations/{created.json()['conversation_id']}/messages"
        response = await client.post(path, json=body, headers={"If-Match": '"7"'})
        assert response.status_code == 422, response.text
        problem = response.json()
        assert problem["code"] == "validation_error"
        assert problem["detail"].startswith(f"{where}:"), problem["detail"]


async def test_max_iterations_is_a_json_integer(make_client: AppFactory) -> None:
    async with make_client() as client:
        for value in ("5", True):
            response = await client.post("/v1/conversations", json={"input": "x", "max_iterations": value})
            assert response.status_code == 422, response.text
            assert response.json()["detail"].startswith("max_iterations:")
