"""A model server that streams without end: the turn fails at SABRE_LLM_MAX_REPLY_CHARS, clearly,
and the conversation stays usable."""

from __future__ import annotations

from app.llm.scripted import Reply, ScriptedLLM
from tests.conftest import AppFactory
from tests.conversations.test_turns import create


async def test_a_reply_past_the_cap_fails_its_turn_and_nothing_else(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    llm.script(Reply(text="<helpers>\nx = 1\n" + "#" * 50_000, chunk_size=500), "Fine again.")
    async with make_client(llm_max_reply_chars=5_000) as client:
        turn = (await create(client, "hello")).json()
        assert turn["status"] == "failed", turn
        assert turn["error"]["code"] == "llm_bad_response"
        assert turn["error"]["retryable"] is False
        assert "SABRE_LLM_MAX_REPLY_CHARS" in turn["error"]["message"]
        assert len(llm.requests) == 1  # not retried
        again = await client.post(
            f"/v1/conversations/{turn['conversation_id']}/messages", json={"input": "again"}
        )
        assert again.status_code == 200, again.text
        assert again.json()["output"] == "Fine again."
