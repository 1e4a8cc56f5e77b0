"""GET /v1/personas and /v1/personas/{name}: what a client sees, behind the API key like the rest."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.personas.loader import PersonaError, load_personas
from app.personas.prompt import build_prompt
from app.personas.tokens import count_tokens
from tests.conftest import AppFactory

SHIPPED = ["coder", "data-analyst", "default", "tau2-airline", "tau2-retail", "web-researcher"]


async def test_list_personas(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/personas")
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [p["name"] for p in data] == SHIPPED
    by_name = {p["name"]: p for p in data}
    assert by_name["default"]["featured_helpers"] == ["*"]
    assert by_name["tau2-retail"]["tokenizer"] == "cl100k_base"
    personas = load_personas()
    for name in SHIPPED:
        assert by_name[name]["prompt_tokens"] == count_tokens(build_prompt(personas[name]))
        assert by_name[name]["prompt_tokens"] > 200
    assert "identity" not in by_name["coder"]


async def test_get_persona_in_full(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/personas/tau2-retail")
    assert response.status_code == 200, response.text
    persona = response.json()
    assert persona["name"] == "tau2-retail"
    assert persona["identity"].startswith("You are a customer service agent")
    assert len(persona["examples"]) == 3
    assert persona["documented_helpers"] == ["result", "parallel"]
    tools = {t["name"]: t for t in persona["custom_tools"]}
    lookup = tools["find_user_id_by_name_zip"]
    assert lookup["execution_mode"] == "external"
    assert lookup["runs"] == "caller"
    assert lookup["implementation"] is None
    assert lookup["parameters"]["required"] == ["first_name", "last_name", "zip"]
    assert (
        lookup["signature"] == "find_user_id_by_name_zip(*, first_name: str, last_name: str, zip: str) -> str"
    )
    assert lookup["returns"]["type"] == "str"
    assert persona["limits"] is None
    assert persona["network"] is None

    researcher = (await client.get("/v1/personas/web-researcher")).json()
    assert researcher["network"] == {"allow": ["*"], "deny": []}


async def test_unknown_persona_is_a_404_problem(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/personas/pirate")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == "not_found"
    assert problem["detail"] == f"No persona 'pirate'; available: {', '.join(SHIPPED)}."
    assert problem["instance"] == "/v1/personas/pirate"


async def test_personas_need_an_api_key_when_keys_exist(make_client: AppFactory) -> None:
    async with make_client(api_keys="acme:sk-acme-key") as c:
        assert (await c.get("/v1/personas")).status_code == 401
        assert (await c.get("/v1/personas/default")).status_code == 401
        headers = {"Authorization": "Bearer sk-acme-key"}
        assert (await c.get("/v1/personas", headers=headers)).status_code == 200
        assert (await c.get("/v1/personas/default", headers=headers)).status_code == 200


async def test_user_personas_are_served(make_client: AppFactory, tmp_path: Path) -> None:
    user = tmp_path / "personas"
    user.mkdir()
    (user / "coder.yaml").write_text("identity: You are my coder.\nfeatured_helpers: [result]\n")
    (user / "support.yaml").write_text(
        "description: Support desk.\n"
        "identity: You answer support tickets.\n"
        "custom_tools:\n"
        "  - name: lookup_ticket\n"
        "    description: Find a ticket.\n"
        "    execution_mode: internal\n"
        "    implementation: mcp://helpdesk/get_ticket\n"
        "  - name: score_ticket\n"
        "    description: Score a ticket.\n"
        "    execution_mode: internal\n"
        "    implementation: tools/score.py::score\n"
        "limits: {cpu_seconds: 5, disk_mb: 64}\n"
    )
    (user / "tools").mkdir()
    (user / "tools" / "score.py").write_text("def score():\n    return 1\n")
    # The MCP server must be configured for the service to start; it is not contacted until a call.
    servers = tmp_path / "mcp_servers.yaml"
    servers.write_text("servers:\n  helpdesk: {transport: http, url: 'http://127.0.0.1:9/mcp'}\n")
    async with make_client(personas_dir=user, mcp_servers=servers) as c:
        names = [p["name"] for p in (await c.get("/v1/personas")).json()["data"]]
        assert names == sorted([*SHIPPED, "support"])
        coder = (await c.get("/v1/personas/coder")).json()
        assert coder["identity"] == "You are my coder."
        support = (await c.get("/v1/personas/support")).json()
        assert support["custom_tools"][0]["implementation"] == "mcp"
        # Who runs each: an MCP tool the service, a Python function the sandbox (both "internal").
        assert [(t["execution_mode"], t["runs"]) for t in support["custom_tools"]] == [
            ("internal", "service"),
            ("internal", "sandbox"),
        ]
        # Every limit a persona may set is shown (the API once listed four of ten).
        assert support["limits"] == {
            "cpu_seconds": 5.0,
            "memory_mb": None,
            "wall_clock_seconds": None,
            "stdout_bytes": None,
            "max_processes": None,
            "file_size_mb": None,
            "open_files": None,
            "snapshot_bytes": None,
            "disk_mb": 64,
            "disk_files": None,
        }


async def test_a_broken_user_persona_stops_the_service(make_client: AppFactory, tmp_path: Path) -> None:
    (tmp_path / "coder.yaml").write_text("identity: x\nfeatured_helpers: [no_such_helper]\n")
    with pytest.raises(PersonaError) as caught:
        async with make_client(personas_dir=tmp_path):
            pass
    assert f"{tmp_path / 'coder.yaml'}:2: persona 'coder': featured_helpers[0]" in str(caught.value)
