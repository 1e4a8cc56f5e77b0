"""The headers the spec documents are sent: WWW-Authenticate on 401, ETag (the version, usable as
If-Match) where If-Match is honoured, Location on a 201, every method of a path in a 405's Allow."""

from __future__ import annotations

from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory


async def test_documented_headers_are_sent(make_client: AppFactory, llm: ScriptedLLM) -> None:
    llm.script("Hello.", "Again.")
    async with make_client(api_keys="t:sk-headers") as client:
        denied = await client.get("/v1/personas")
        assert denied.status_code == 401
        assert denied.headers["www-authenticate"] == 'Bearer realm="sabre"'
        assert denied.headers["content-type"] == "application/problem+json"

        auth = {"Authorization": "Bearer sk-headers"}
        created = await client.post("/v1/conversations", json={"input": "hi"}, headers=auth)
        assert created.status_code == 201, created.text
        turn = created.json()
        assert (
            created.headers["location"]
            == f"/v1/conversations/{turn['conversation_id']}/turns/{turn['turn_id']}"
        )
        assert created.headers["etag"] == '"1"'
        path = f"/v1/conversations/{turn['conversation_id']}"
        state = await client.get(path, headers=auth)
        assert state.headers["etag"] == f'"{state.json()["version"]}"'
        # The ETag is what If-Match takes back.
        again = await client.post(
            f"{path}/messages", json={"input": "again"}, headers={**auth, "If-Match": state.headers["etag"]}
        )
        assert again.status_code == 200, again.text
        assert again.headers["etag"] == '"2"'
        stale = await client.post(
            f"{path}/messages", json={"input": "x"}, headers={**auth, "If-Match": '"1"'}
        )
        assert stale.status_code == 412
        malformed = await client.post(
            f"{path}/messages", json={"input": "x"}, headers={**auth, "If-Match": "{}"}
        )
        assert malformed.status_code == 422

        not_allowed = await client.put(path, headers=auth)
        assert not_allowed.status_code == 405
        assert not_allowed.headers["allow"] == "DELETE, GET, PATCH"
