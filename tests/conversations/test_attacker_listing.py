"""Hostile listings: crafted cursors and metadata filters are a 422 or a page, never a 500."""

from __future__ import annotations

import base64
import json

import httpx
import pytest

from app.llm.scripted import ScriptedLLM


def _cursor(created_at: str, conversation_id: str = "conv_x") -> str:
    raw = json.dumps({"v": 1, "created_at": created_at, "id": conversation_id}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("created_at", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
async def test_a_cursor_whose_time_has_no_utc_value_is_422(
    client: httpx.AsyncClient, llm: ScriptedLLM, created_at: str
) -> None:
    # A well-formed cursor at the calendar's edge: converting it to UTC in the query overflowed.
    response = await client.get("/v1/conversations", params={"after": _cursor(created_at)})
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "invalid_cursor"


async def test_a_cursor_with_an_offset_lists_from_its_instant(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script("one")
    created = (await client.post("/v1/conversations", json={"input": "hi"})).json()
    listed = await client.get("/v1/conversations", params={"after": _cursor("2999-01-01T05:00:00+05:00")})
    assert listed.status_code == 200, listed.text
    assert created["conversation_id"] in [c["id"] for c in listed.json()["data"]]


@pytest.mark.parametrize(
    "value", ["99999999999999999999", "-99999999999999999999", "9" * 500, "1e308", "5e-324", "-0", "1_000"]
)
async def test_metadata_filters_with_numbers_past_64_bits_are_a_page(
    client: httpx.AsyncClient, llm: ScriptedLLM, value: str
) -> None:
    # SQLite cannot bind an integer past 64 bits (it compared the filter as one: a 500); stored
    # metadata keeps to 64 bits, so such a filter matches a string only.
    llm.script("one")
    body = {"input": "hi", "metadata": {"n": value}}
    created = (await client.post("/v1/conversations", json=body)).json()
    response = await client.get("/v1/conversations", params={"metadata[n]": value})
    assert response.status_code == 200, response.text
    assert [c["id"] for c in response.json()["data"]] == [created["conversation_id"]]
