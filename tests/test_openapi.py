"""The committed OpenAPI spec is what the app serves (SDKs are generated from the file)."""

from __future__ import annotations

import json
from pathlib import Path

from app.main import openapi_json

SPEC = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


def test_committed_spec_matches_the_app() -> None:
    served = openapi_json()
    committed = SPEC.read_text(encoding="utf-8")
    assert json.loads(committed) == json.loads(served), (
        "openapi/openapi.json is stale: run `uv run sabre openapi` and commit the result"
    )


def test_every_operation_documents_problem_responses() -> None:
    spec = json.loads(openapi_json())
    for path, operations in spec["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" in responses, f"{method} {path}"
            assert "404" in responses, f"{method} {path}"
