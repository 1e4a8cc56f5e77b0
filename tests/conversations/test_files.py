"""Figures a block leaves open are stored, served to their tenant, and shown to the model."""

from __future__ import annotations

import re

from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory
from tests.conversations.test_bad_input import assert_problem

KEYS = "acme:key-a,globex:key-g"
PLOT = "<helpers>\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\n</helpers>"


async def test_figure_is_stored_served_and_shown(make_client: AppFactory, llm: ScriptedLLM) -> None:
    llm.script(PLOT, "Here is the chart.")
    acme = {"Authorization": "Bearer key-a"}
    async with make_client(api_keys=KEYS, llm_images=True) as client:
        turn = (await client.post("/v1/conversations", json={"input": "plot"}, headers=acme)).json()
        assert turn["status"] == "completed", turn
        shown = llm.requests[1]
        match = re.search(r"figure: (/v1/files/file_\w+)", shown.all_text)
        assert match, shown.all_text
        # The model that takes images got the PNG with the result.
        images = [url for message in shown.messages for url in message.images]
        assert len(images) == 1
        assert images[0].startswith("data:image/png;base64,")

        response = await client.get(match.group(1), headers=acme)
        assert response.status_code == 200
        assert response.headers["content-type"] == "image/png"
        assert response.content.startswith(b"\x89PNG\r\n\x1a\n")

        foreign = await client.get(match.group(1), headers={"Authorization": "Bearer key-g"})
        assert_problem(foreign, 404, "not_found")
        assert_problem(await client.get("/v1/files/file_nope", headers=acme), 404, "not_found")

        messages = (
            await client.get(f"/v1/conversations/{turn['conversation_id']}/messages", headers=acme)
        ).json()
        result = next(p for m in messages["data"] for p in m["parts"] if p["kind"] == "helpers_result")
        assert result["files"] == [match.group(1).rsplit("/", 1)[1]]

        # Deleting the conversation deletes its files.
        assert (
            await client.delete(f"/v1/conversations/{turn['conversation_id']}", headers=acme)
        ).status_code == 204
        assert_problem(await client.get(match.group(1), headers=acme), 404, "not_found")


async def test_no_images_for_text_models(make_client: AppFactory, llm: ScriptedLLM) -> None:
    llm.script(PLOT, "ok")
    async with make_client() as client:
        turn = (await client.post("/v1/conversations", json={"input": "plot"})).json()
    assert turn["status"] == "completed"
    assert "figure: /v1/files/file_" in llm.requests[1].all_text
    assert not [url for message in llm.requests[1].messages for url in message.images]
