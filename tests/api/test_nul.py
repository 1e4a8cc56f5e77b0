"""NUL characters anywhere in a request are a 422 on both stores (PostgreSQL cannot store them; they
were a 500 there, found by schemathesis)."""

from __future__ import annotations

import pytest

from app.kit.errors import Unprocessable
from app.kit.json_body import loads
from tests.conftest import AppFactory


@pytest.mark.parametrize(
    ("method", "path", "body", "where"),
    [
        ("POST", "/v1/conversations", {"input": "hi\u0000"}, "input"),
        ("POST", "/v1/conversations", {"input": "hi", "instructions": "\u0000"}, "instructions"),
        ("POST", "/v1/conversations", {"input": "hi", "metadata": {"k\u0000": 1}}, "metadata.k\\u0000"),
        (
            "POST",
            "/v1/conversations",
            {"input": "hi", "tools": [{"type": "function", "name": "t", "description": "a\u0000"}]},
            "tools.0.description",
        ),
        ("GET", "/v1/conversations?metadata[a]=x%00y", None, "query.metadata[a]"),
        ("GET", "/v1/conversations?persona=%00", None, "query.persona"),
        ("GET", "/v1/conversations/conv_%00", None, "path.conversation_id"),
        ("GET", "/v1/personas/a%00", None, "path.name"),
    ],
)
async def test_nul_characters_are_refused(
    make_client: AppFactory, method: str, path: str, body: object, where: str
) -> None:
    async with make_client() as client:
        response = await client.request(method, path, json=body)
        assert response.status_code == 422, response.text
        problem = response.json()
        assert problem["detail"].startswith(f"{where}: NUL characters")
        assert problem["errors"][0]["type"] == "string_nul"


async def test_an_escaped_backslash_u0000_is_text_not_nul(make_client: AppFactory) -> None:
    async with make_client() as client:
        response = await client.get("/v1/conversations", params={"persona": "\\u0000"})
        assert response.status_code == 200, response.text


def test_loads_tells_an_escaped_backslash_from_a_nul() -> None:
    assert loads(b'{"a": "\\\\u0000"}') == {"a": "\\u0000"}  # a backslash, then "u0000"
    with pytest.raises(Unprocessable):
        loads(b'{"a": ["ok", {"b": "\\u0000"}]}')
