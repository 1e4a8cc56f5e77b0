"""Finding conversations (GET /v1/conversations: filters, cursor pages, tenants) and changing their
metadata (PATCH /v1/conversations/{id}: a merge patch), over HTTP on both stores (issue 11, item 7)."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from typing import Any

import httpx

from app.conversations.service import METADATA_PATCH_ATTEMPTS
from app.llm.scripted import Reply, ScriptedLLM
from tests.conftest import AppFactory
from tests.conversations.test_bad_input import assert_problem
from tests.conversations.test_external_tools import GET_ORDER, block
from tests.conversations.test_idempotency_lease import wait_for


def two_tenants() -> tuple[str, dict[str, str], dict[str, str]]:
    """``SABRE_API_KEYS`` for two fresh tenants (the SQLite store is shared by the session, so a
    tenant of its own makes the test's listing exactly what it created), and each one's headers."""
    a, b = f"ta{secrets.token_hex(4)}", f"tb{secrets.token_hex(4)}"
    key_a, key_b = f"key-{secrets.token_hex(8)}", f"key-{secrets.token_hex(8)}"
    return (
        f"{a}:{key_a},{b}:{key_b}",
        {"Authorization": f"Bearer {key_a}"},
        {"Authorization": f"Bearer {key_b}"},
    )


async def create(client: httpx.AsyncClient, auth: dict[str, str], **body: Any) -> str:
    response = await client.post("/v1/conversations", json={"input": "hi", **body}, headers=auth)
    assert response.status_code == 201, response.text
    return str(response.json()["conversation_id"])


async def listed(client: httpx.AsyncClient, auth: dict[str, str], **params: Any) -> list[str]:
    response = await client.get("/v1/conversations", params=params, headers=auth)
    assert response.status_code == 200, response.text
    page = response.json()
    assert page["has_more"] is False
    return [c["id"] for c in page["data"]]


async def test_filters(make_client: AppFactory, llm: ScriptedLLM) -> None:
    keys, auth, _ = two_tenants()
    llm.script("1", "2", "3", "4", block("get_order_details(order_id='1')"))
    async with make_client(api_keys=keys) as client:
        c1 = await create(
            client,
            auth,
            metadata={"tier": "gold", "seats": 5, "beta": True, "ratio": 1.5, 'odd "key".$': "q", "n": None},
        )
        c2 = await create(client, auth, metadata={"tier": "silver", "seats": "5", "beta": "true"})
        c3 = await create(client, auth, metadata={"tier": "gold", "seats": 6, "beta": False})
        c4 = await create(client, auth, persona="coder", metadata={"tier": "gold"})
        c5 = await create(client, auth, tools=[GET_ORDER], metadata={"tier": "bronze"})

        everything = await client.get("/v1/conversations", headers=auth)
        assert everything.status_code == 200
        page = everything.json()
        assert [c["id"] for c in page["data"]] == [c5, c4, c3, c2, c1]  # newest first
        assert page["next_after"] is None
        first = page["data"][-1]
        assert first["metadata"]["tier"] == "gold"
        assert first["status"] == "idle"
        assert page["data"][0]["status"] == "awaiting_tool_results"
        assert page["data"][0]["pending_tool_calls"][0]["name"] == "get_order_details"

        async def match(**params: Any) -> list[str]:
            return await listed(client, auth, **params)

        assert await match(**{"metadata[tier]": "gold"}) == [c4, c3, c1]
        assert await match(**{"metadata[tier]": "gold", "metadata[seats]": "5"}) == [c1]
        # Compared as strings with the stored scalar's JSON text: 5 and "5" both match "5".
        assert await match(**{"metadata[seats]": "5"}) == [c2, c1]
        assert await match(**{"metadata[beta]": "true"}) == [c2, c1]
        assert await match(**{"metadata[beta]": "false"}) == [c3]
        assert await match(**{"metadata[ratio]": "1.5"}) == [c1]
        assert await match(**{"metadata[ratio]": "1.50"}) == []
        assert await match(**{"metadata[seats]": "05"}) == []
        assert await match(**{'metadata[odd "key".$]': "q"}) == [c1]
        assert await match(**{"metadata[n]": "null"}) == []  # null never matches
        assert await match(**{"metadata[n]": ""}) == []
        assert await match(**{"metadata[missing]": "gold"}) == []
        assert await match(persona="coder") == [c4]
        assert await match(persona="coder", **{"metadata[tier]": "silver"}) == []
        assert await match(status="awaiting_tool_results") == [c5]
        assert await match(status="idle") == [c4, c3, c2, c1]
        assert await match(status="idle", **{"metadata[tier]": "gold"}, persona="default") == [c3, c1]

        running = await client.get("/v1/conversations", params={"status": "running"}, headers=auth)
        assert "lease lock" in str(assert_problem(running, 422, "validation_error")["detail"])
        assert_problem(
            await client.get("/v1/conversations", params={"status": "done"}, headers=auth),
            422,
            "validation_error",
        )
        for params in (
            {"stauts": "idle"},  # a misspelt filter is refused, never silently ignored
            {"metadata": "gold"},
            {"metadata[tier": "gold"},
            {"metadata[" + "k" * 65 + "]": "x"},
            {"metadata[tier]": "x" * 513},
            {f"metadata[k{i}]": "x" for i in range(17)},
        ):
            assert_problem(
                await client.get("/v1/conversations", params=params, headers=auth), 422, "validation_error"
            )
        twice = await client.get("/v1/conversations?metadata[tier]=gold&metadata[tier]=silver", headers=auth)
        assert_problem(twice, 422, "validation_error")
        same_twice = await client.get(
            "/v1/conversations?metadata[tier]=gold&metadata[tier]=gold", headers=auth
        )
        assert [c["id"] for c in same_twice.json()["data"]] == [c4, c3, c1]


async def test_pages_hold_still_while_conversations_are_created(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    keys, auth, _ = two_tenants()
    llm.script(*[f"reply {i}" for i in range(12)])
    async with make_client(api_keys=keys) as client:
        before = [await create(client, auth, metadata={"batch": "old", "i": i}) for i in range(7)]
        expected = before[::-1]
        seen: list[str] = []
        after: str | None = None
        added: list[str] = []
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 3}
            if after is not None:
                params["after"] = after
            response = await client.get("/v1/conversations", params=params, headers=auth)
            assert response.status_code == 200, response.text
            page = response.json()
            pages += 1
            # Newer conversations arrive between pages: they sort before the cursor, so the pages
            # after it neither repeat nor skip anything.
            seen += [c["id"] for c in page["data"] if c["id"] not in added]
            assert not {c["id"] for c in page["data"]} & set(added)
            if not page["has_more"]:
                assert page["next_after"] is None
                break
            after = page["next_after"]
            assert isinstance(after, str)
            added += [await create(client, auth, metadata={"batch": "new"}) for _ in range(2)]
        assert pages == 3
        assert seen == expected
        assert len(set(seen)) == len(seen)
        # A fresh listing starts from the newest, including what was created meanwhile.
        assert await listed(client, auth, limit=100) == added[::-1] + expected
        # Filters and cursors combine: two pages of the old batch.
        first = (
            await client.get("/v1/conversations", params={"metadata[batch]": "old", "limit": 4}, headers=auth)
        ).json()
        second = (
            await client.get(
                "/v1/conversations",
                params={"metadata[batch]": "old", "limit": 4, "after": first["next_after"]},
                headers=auth,
            )
        ).json()
        assert [c["id"] for c in first["data"] + second["data"]] == expected
        assert second["has_more"] is False


async def test_tenants_see_only_their_own(make_client: AppFactory, llm: ScriptedLLM) -> None:
    keys, acme, globex = two_tenants()
    llm.script("a1", "a2", "g1")
    async with make_client(api_keys=keys) as client:
        a1 = await create(client, acme, metadata={"shared": "yes"})
        a2 = await create(client, acme, metadata={"shared": "yes"})
        g1 = await create(client, globex, metadata={"shared": "yes"})
        assert await listed(client, acme) == [a2, a1]
        assert await listed(client, globex) == [g1]
        assert await listed(client, globex, **{"metadata[shared]": "yes"}) == [g1]
        # A cursor from one tenant's listing gives the other nothing of the first's.
        page = (await client.get("/v1/conversations", params={"limit": 1}, headers=acme)).json()
        assert await listed(client, globex, after=page["next_after"]) == []
        # Another tenant's id is 404 for PATCH, and its metadata is unchanged.
        foreign = await client.patch(
            f"/v1/conversations/{a1}", json={"metadata": {"shared": "no"}}, headers=globex
        )
        assert_problem(foreign, 404, "not_found")
        mine = (await client.get(f"/v1/conversations/{a1}", headers=acme)).json()
        assert mine["metadata"] == {"shared": "yes"}
        assert (await client.get("/v1/conversations")).status_code == 401


def cursor(payload: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


async def test_bad_cursor_and_limit(client: httpx.AsyncClient) -> None:
    for after in (
        "!!!",
        "abc",
        base64.urlsafe_b64encode(b"\xff\xfe garbage").decode(),
        cursor({"v": 1, "created_at": "yesterday", "id": "conv_1"}),
        cursor({"v": 1, "created_at": "2026-01-01T00:00:00", "id": "conv_1"}),  # no time zone
        cursor({"v": 2, "created_at": "2026-01-01T00:00:00Z", "id": "conv_1"}),  # a format we do not know
        cursor({"v": 1, "created_at": "2026-01-01T00:00:00Z", "id": ""}),
        cursor(["2026-01-01T00:00:00Z", "conv_1"]),
    ):
        response = await client.get("/v1/conversations", params={"after": after})
        problem = assert_problem(response, 422, "invalid_cursor")
        assert problem["errors"] == [{"loc": ["query", "after"], "msg": "invalid cursor", "type": "cursor"}]
    too_long = await client.get("/v1/conversations", params={"after": "a" * 201})
    assert_problem(too_long, 422, "validation_error")
    good = cursor({"v": 1, "created_at": "2000-01-01T00:00:00Z", "id": "conv_0"})
    assert (await client.get("/v1/conversations", params={"after": good})).json() == {
        "data": [],
        "has_more": False,
        "next_after": None,
    }
    for limit in ("0", "101", "-1", "ten", "1.5"):
        response = await client.get("/v1/conversations", params={"limit": limit})
        assert_problem(response, 422, "validation_error")
    assert (await client.get("/v1/conversations", params={"limit": 100})).status_code == 200


async def test_patch_merges_metadata(make_client: AppFactory, llm: ScriptedLLM) -> None:
    keys, auth, _ = two_tenants()
    llm.script("hello")
    async with make_client(api_keys=keys) as client:
        conv = await create(client, auth, metadata={"a": 1, "b": "x", "c": None})
        url = f"/v1/conversations/{conv}"
        before = (await client.get(url, headers=auth)).json()
        patched = await client.patch(url, json={"metadata": {"b": None, "d": True, "a": 2}}, headers=auth)
        assert patched.status_code == 200, patched.text
        body = patched.json()
        assert body["metadata"] == {"a": 2, "c": None, "d": True}
        assert list(body["metadata"]) == ["a", "c", "d"]  # kept keys keep their place
        assert body["version"] == before["version"]  # labels are not a turn
        assert body["updated_at"] > before["updated_at"]
        assert (await client.get(url, headers=auth)).json()["metadata"] == body["metadata"]
        # Removing a key that is not there is no error; the merge-patch media type is accepted.
        again = await client.patch(
            url,
            content=json.dumps({"metadata": {"zzz": None, "c": None}}),
            headers={"Content-Type": "application/merge-patch+json", **auth},
        )
        assert again.status_code == 200, again.text
        assert again.json()["metadata"] == {"a": 2, "d": True}
        assert await listed(client, auth, **{"metadata[d]": "true"}) == [conv]
        assert (await client.patch(url, json={"metadata": {}}, headers=auth)).json()["metadata"] == {
            "a": 2,
            "d": True,
        }


async def test_patch_validation(make_client: AppFactory, llm: ScriptedLLM) -> None:
    keys, auth, _ = two_tenants()
    llm.script("hello")
    async with make_client(api_keys=keys) as client:
        conv = await create(client, auth, metadata={f"k{i}": i for i in range(60)})
        url = f"/v1/conversations/{conv}"
        for body in (
            {},
            {"metadata": None},
            {"metadata": ["a"]},
            {"metadata": {"nested": {"a": 1}}},
            {"metadata": {"list": [1]}},
            {"metadata": {"k" * 65: "x"}},
            {"metadata": {"long": "x" * 513}},
            {"metadata": {"big": 2**63}},
            {"metadata": {f"n{i}": 1 for i in range(65)}},
            {"metadata": {}, "status": "idle"},  # only metadata can be patched
            {"metadata": {}, "version": 3},
        ):
            assert_problem(await client.patch(url, json=body, headers=auth), 422, "validation_error")
        # 60 keys stored: adding five would leave 65; adding five while removing one leaves 64.
        more = {f"new{i}": i for i in range(5)}
        too_many = await client.patch(url, json={"metadata": more}, headers=auth)
        assert "65 keys" in str(assert_problem(too_many, 422, "validation_error")["detail"])
        fits = await client.patch(url, json={"metadata": {**more, "k0": None}}, headers=auth)
        assert fits.status_code == 200, fits.text
        assert len(fits.json()["metadata"]) == 64
        assert_problem(
            await client.patch(url, content=b"{", headers={"Content-Type": "application/json", **auth}),
            400,
            "invalid_json",
        )
        unknown = await client.patch("/v1/conversations/conv_nope", json={"metadata": {}}, headers=auth)
        assert_problem(unknown, 404, "not_found")


async def test_patch_if_match(make_client: AppFactory, llm: ScriptedLLM) -> None:
    keys, auth, _ = two_tenants()
    llm.script("hello", "next")
    async with make_client(api_keys=keys) as client:
        conv = await create(client, auth)
        url = f"/v1/conversations/{conv}"
        stale = await client.patch(url, json={"metadata": {"a": 1}}, headers={"If-Match": '"0"', **auth})
        problem = assert_problem(stale, 412, "precondition_failed")
        assert problem["current"] == {"version": 1}
        ok = await client.patch(url, json={"metadata": {"a": 1}}, headers={"If-Match": '"1"', **auth})
        assert ok.status_code == 200, ok.text
        assert ok.json()["version"] == 1
        turn = await client.post(f"{url}/messages", json={"input": "more"}, headers=auth)
        assert turn.json()["version"] == 2
        late = await client.patch(url, json={"metadata": {"a": 2}}, headers={"If-Match": "1", **auth})
        assert_problem(late, 412, "precondition_failed")
        assert (await client.get(url, headers=auth)).json()["metadata"] == {"a": 1}


async def test_patch_during_a_turn_does_not_disturb_it(make_client: AppFactory, llm: ScriptedLLM) -> None:
    """The version is the turns' optimistic lock: a PATCH must neither bump it (the running turn's
    commit would fail) nor be overwritten by the turn's commit."""
    keys, auth, _ = two_tenants()
    llm.script("hello", Reply(text="slow answer", delay=1.0))
    async with make_client(api_keys=keys) as client:
        conv = await create(client, auth, metadata={"stage": "new"})
        url = f"/v1/conversations/{conv}"
        turn = asyncio.create_task(client.post(f"{url}/messages", json={"input": "go"}, headers=auth))
        await wait_for(lambda: len(llm.requests) == 2)
        patched = await client.patch(url, json={"metadata": {"stage": "reviewed"}}, headers=auth)
        assert patched.status_code == 200, patched.text
        assert patched.json()["status"] == "running"
        done = await turn
        assert done.status_code == 200, done.text
        assert done.json()["output"] == "slow answer"
        view = (await client.get(url, headers=auth)).json()
        assert view["version"] == 2
        assert view["metadata"] == {"stage": "reviewed"}


async def test_concurrent_patches_lose_nothing(make_client: AppFactory, llm: ScriptedLLM) -> None:
    keys, auth, _ = two_tenants()
    llm.script("hello")
    async with make_client(api_keys=keys) as client:
        conv = await create(client, auth, metadata={"base": 0})
        url = f"/v1/conversations/{conv}"
        # More writers than a compare-and-set retries: each must still get its 200, not a 409.
        writers = 3 * METADATA_PATCH_ATTEMPTS
        responses = await asyncio.gather(
            *(client.patch(url, json={"metadata": {f"k{i}": i}}, headers=auth) for i in range(writers))
        )
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        metadata = (await client.get(url, headers=auth)).json()["metadata"]
        assert metadata == {"base": 0, **{f"k{i}": i for i in range(writers)}}
