"""The committed OpenAPI spec is what the app serves, and it is one SDK generators do well with."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter
from pydantic import BaseModel

from app.auth.dependencies import Tenant
from app.config import Settings
from app.conversations.schemas import TurnErrorBody
from app.kit.json_body import StrictJSONRoute
from app.kit.openapi import add_component_schemas
from app.main import create_app, openapi_json
from app.openai_compat.schemas import ChatCompletionChunk as ChunkModel
from app.orchestrator.loop import TurnErrorCode

SPEC = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(openapi_json())
    return loaded


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, ops in spec["paths"].items() for method, op in ops.items()]


def test_committed_spec_matches_the_app() -> None:
    served = openapi_json()
    committed = SPEC.read_text(encoding="utf-8")
    assert json.loads(committed) == json.loads(served), (
        "openapi/openapi.json is stale: run `uv run sabre openapi` and commit the result"
    )


def test_operation_ids_are_unique_resource_dot_verb(spec: dict[str, Any]) -> None:
    ids = [op["operationId"] for _, _, op in operations(spec)]
    assert len(ids) == len(set(ids))
    for operation_id in ids:
        assert re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+", operation_id), operation_id
    assert {"conversations.create", "conversations.messages.create", "conversations.turns.cancel"} <= set(ids)


def test_every_error_is_a_problem_under_its_media_type(spec: dict[str, Any]) -> None:
    for method, path, op in operations(spec):
        for status, response in op["responses"].items():
            if int(status) >= 400:
                assert response["content"] == {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                }, f"{method} {path} {status}"
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_errors_are_those_each_route_can_answer(spec: dict[str, Any]) -> None:
    for method, path, op in operations(spec):
        codes = set(op["responses"])
        if op.get("security"):  # it takes an API key (and so reads the store)
            assert {"401", "503"} <= codes, f"{method} {path}"
            headers = op["responses"]["401"]["headers"]
            assert headers["WWW-Authenticate"]["required"] is True
            assert "Retry-After" in op["responses"]["503"]["headers"]
        if path.startswith("/v1/conversations") or path.startswith("/v1/personas"):
            assert op.get("security"), f"{method} {path}"
        if "{" not in path:
            assert "404" not in codes or method == "post", f"{method} {path}: nothing to find"
        if method in ("get", "delete"):
            assert "413" not in codes, f"{method} {path}: no body"
    assert set(spec["paths"]["/healthz"]["get"]["responses"]) == {"200"}
    patch = spec["paths"]["/v1/conversations/{conversation_id}"]["patch"]["responses"]
    assert {"400", "404", "409", "412", "413", "422"} <= set(patch)
    assert "ETag" in patch["200"]["headers"]
    create = spec["paths"]["/v1/conversations"]["post"]["responses"]
    assert create["201"]["headers"]["Location"]["required"] is True


def test_alternatives_are_one_of(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    for part in ("TextPart", "HelpersPart", "HelpersResultPart", "ToolCallPart", "ToolResultPart"):
        assert "kind" in schemas[part]["required"], part
    parts = schemas["MessageOut"]["properties"]["parts"]["items"]
    assert parts["discriminator"]["propertyName"] == "kind"
    tools = schemas["CreateConversation"]["properties"]["tools"]["items"]["oneOf"]
    assert {t["$ref"].rsplit("/", 1)[1] for t in tools} == {"ResponsesTool", "ChatTool"}
    results = schemas["ToolResults"]["properties"]["results"]["items"]["oneOf"]
    assert {r["$ref"].rsplit("/", 1)[1] for r in results} == {"ToolOutput", "ToolError"}
    assert schemas["ToolOutput"]["required"] == ["tool_call_id", "output"]
    assert schemas["ToolError"]["required"] == ["tool_call_id", "error"]


def test_streams_document_each_event(spec: dict[str, Any]) -> None:
    """A `text/event-stream` answer documents one event (schemathesis checks each against it): a
    streamed chat completion's `data` is a ChatCompletionChunk as JSON or the closing `[DONE]`."""
    for method, path, op in operations(spec):
        for status, response in op["responses"].items():
            stream = response.get("content", {}).get("text/event-stream")
            if stream is not None:
                assert stream["schema"]["type"] == "object", f"{method} {path} {status}"
                assert "data" in stream["schema"]["required"], f"{method} {path} {status}"
    chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    data = chat["text/event-stream"]["schema"]["properties"]["data"]["oneOf"]
    assert data[0]["contentSchema"] == {"$ref": "#/components/schemas/ChatCompletionChunk"}
    assert data[1]["const"] == "[DONE]"
    schemas = spec["components"]["schemas"]
    assert {"ChatCompletionChunk", "ChunkChoice", "ChunkDelta", "ChunkToolCall"} <= set(schemas)


def test_component_schemas_do_not_clash() -> None:
    class ChatCompletionChunk(BaseModel):  # another model under a documented name
        other: int

    added: dict[str, Any] = {"components": {"schemas": {}}}
    add_component_schemas(added, [ChunkModel])
    assert "ChatCompletionChunk" in added["components"]["schemas"]
    add_component_schemas(added, [ChunkModel])  # the same schema again: no clash
    with pytest.raises(ValueError, match="ChatCompletionChunk"):
        add_component_schemas(added, [ChatCompletionChunk])


def test_files_are_binary_and_servers_are_listed(spec: dict[str, Any]) -> None:
    content = spec["paths"]["/v1/files/{file_id}"]["get"]["responses"]["200"]["content"]
    assert content == {"image/png": {"schema": {"type": "string", "format": "binary"}}}
    assert spec["servers"][0]["url"].startswith("http://127.0.0.1")
    for name in ("CreateConversation", "ToolResults", "Problem"):
        assert spec["components"]["schemas"][name]["examples"], name


class OpenAIError(BaseModel):
    error: dict[str, str]


class Ask(BaseModel):
    text: str


def test_routes_added_later_get_the_same_treatment() -> None:
    """What other domains' routers get: an explicit operation_id is kept, a route without one is
    named from its path, implied errors are added, and an error body of another shape is left alone.
    The paths are ones the app does not serve (a clash would test the real route instead)."""
    router = APIRouter(prefix="/v1", route_class=StrictJSONRoute)

    @router.post(
        "/examples/completions",
        operation_id="example_completions.create",
        responses={400: {"model": OpenAIError}},
    )
    async def complete(body: Ask, tenant: Tenant) -> dict[str, str]:
        return {}

    @router.get("/examples/{example_id}")
    async def get_example(example_id: str, tenant: Tenant) -> dict[str, str]:
        return {}

    app = create_app(Settings())
    assert not set(app.openapi()["paths"]) & {"/v1/embeddings", "/v1/widgets/{widget_id}"}
    app.openapi_schema = None
    app.include_router(router)
    spec = app.openapi()
    post = spec["paths"]["/v1/examples/completions"]["post"]
    assert post["operationId"] == "example_completions.create"
    assert post["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/OpenAIError")
    assert post["responses"]["401"]["content"] == {
        "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
    }
    assert {"401", "413", "422", "503"} <= set(post["responses"])
    assert spec["paths"]["/v1/examples/{example_id}"]["get"]["operationId"] == "examples.get"


def test_the_spec_names_every_turn_error_code() -> None:
    """``TurnErrorBody.code`` is a string (codes may be added), so the spec lists them in words: all
    of ``TurnErrorCode``, and no other."""

    def flat(tp: object) -> set[str]:
        args = typing.get_args(tp)
        return set().union(*(flat(a) for a in args)) if args else {str(tp)}

    described = TurnErrorBody.model_fields["code"].description or ""
    assert set(re.findall(r"`([a-z_]+)`", described)) == flat(TurnErrorCode)
