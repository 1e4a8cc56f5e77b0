"""A request body is parsed only once the caller's key is known (attacker pass on the JSON body
handling).

FastAPI parses a JSON body before it solves the route's dependencies, and ``StrictJSONRoute`` parsed
it even earlier, then walked it for depth, NUL characters and lone surrogates. A body of the size
limit (2 MB) of empty arrays with one ``\\u0000`` held the event loop about 2.3 s before the request
was refused, for a caller with no key at all (it got a 422 that told it the body was read): four
such requests in parallel stalled every tenant's requests for about 10 s (``/healthz`` waited 2.4 s
behind one), and unauthenticated callers are not rate limited. A route with a body that takes a
``Tenant`` now checks the key before reading the body: 401, nothing parsed."""

from __future__ import annotations

from typing import Any

import pytest

from app.kit import json_body
from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory

KEYS = "acme:key-acme-123,globex:key-globex-456"
HOSTILE = b'["\\u0000",' + b"[]," * 1_000 + b"[]]"
JSON = {"content-type": "application/json"}


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the bodies ``json_body.loads`` parsed."""
    sizes: list[int] = []
    original = json_body.loads

    def counting(data: bytes | str) -> Any:
        sizes.append(len(data))
        return original(data)

    monkeypatch.setattr(json_body, "loads", counting)
    return sizes


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/conversations"])
@pytest.mark.parametrize(
    ("headers", "said"),
    [
        ({}, "Send an API key"),
        ({"Authorization": "Bearer not-a-key"}, "not valid"),
        ({"Authorization": "Basic YWNtZTprZXk="}, "Bearer scheme"),
    ],
)
async def test_a_body_without_a_valid_key_is_not_parsed(
    make_client: AppFactory, parsed: list[int], path: str, headers: dict[str, str], said: str
) -> None:
    async with make_client(api_keys=KEYS) as client:
        response = await client.post(path, content=HOSTILE, headers={**JSON, **headers})
        assert response.status_code == 401, response.text
        assert response.json()["code"] == "unauthorized"
        assert said in response.json()["detail"]
    assert parsed == []


async def test_with_a_valid_key_the_body_is_checked_as_before(
    make_client: AppFactory, llm: ScriptedLLM, parsed: list[int]
) -> None:
    llm.script("hello")
    acme = {"Authorization": "Bearer key-acme-123"}
    async with make_client(api_keys=KEYS) as client:
        refused = await client.post("/v1/chat/completions", content=HOSTILE, headers={**JSON, **acme})
        assert refused.status_code == 422, refused.text
        assert "NUL" in refused.json()["detail"]
        body = {"model": "sabre/default", "messages": [{"role": "user", "content": "hi"}]}
        answered = await client.post("/v1/chat/completions", json=body, headers=acme)
        assert answered.status_code == 200, answered.text
        assert answered.json()["choices"][0]["message"]["content"] == "hello"
    assert len(parsed) == 2
