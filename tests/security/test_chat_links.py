"""Chat links of deleted conversations (attacker pass on the Chat Completions face).

A completion answered with an ``Idempotency-Key`` is replayed from the stored turn, and its chat link
stored again (in case the first answer never reached the client). When the tenant had deleted the
conversation meanwhile, that link named a conversation that no longer exists: the foreign key
refused it and the replay was a 500 on both stores. A link is now stored only for a conversation of
the tenant that still exists; the replay answers the stored completion, and the history starts anew.
"""

from __future__ import annotations

import json

from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory

KEYS = "acme:key-acme-123,globex:key-globex-456"
ACME = {"Authorization": "Bearer key-acme-123"}
BODY = {"model": "sabre/default", "messages": [{"role": "user", "content": "hi"}]}


async def test_a_replay_after_the_conversation_was_deleted_answers_the_stored_completion(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    llm.script("hello", "hello again")
    async with make_client(api_keys=KEYS) as client:
        headers = {**ACME, "Idempotency-Key": "chat-then-delete"}
        first = await client.post("/v1/chat/completions", json=BODY, headers=headers)
        assert first.status_code == 200, first.text
        conversation = first.headers["Sabre-Conversation-Id"]
        deleted = await client.delete(f"/v1/conversations/{conversation}", headers=ACME)
        assert deleted.status_code == 204

        replay = await client.post("/v1/chat/completions", json=BODY, headers=headers)
        assert replay.status_code == 200, replay.text
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.json()["choices"][0]["message"]["content"] == "hello"

        # The answered history is linked to nothing now: continuing it starts a new conversation.
        answered = [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"}]
        history = {**BODY, "messages": [*BODY["messages"], *answered]}
        following = await client.post("/v1/chat/completions", json=history, headers=ACME)
        assert following.status_code == 200, following.text
        assert following.headers["Sabre-Conversation-Id"] != conversation
    assert len(llm.requests) == 2


async def test_a_streamed_replay_after_the_conversation_was_deleted_ends_with_an_error(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    """Its events went with the conversation: the replay's stream said nothing after the role and
    ended without ``[DONE]`` or an error, which a client could take for an empty answer."""
    llm.script("hello")
    async with make_client(api_keys=KEYS) as client:
        headers = {**ACME, "Idempotency-Key": "stream-then-delete"}
        body = {**BODY, "stream": True}
        first = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert first.status_code == 200, first.text
        assert first.text.rstrip().endswith("data: [DONE]"), first.text
        conversation = first.headers["Sabre-Conversation-Id"]
        assert (await client.delete(f"/v1/conversations/{conversation}", headers=ACME)).status_code == 204

        replay = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert replay.status_code == 200, replay.text
        assert replay.headers["Idempotent-Replayed"] == "true"
        data = [line.removeprefix("data: ") for line in replay.text.splitlines() if line.startswith("data: ")]
        assert json.loads(data[-1])["error"]["code"] == "turn_gone", data
    assert len(llm.requests) == 1
