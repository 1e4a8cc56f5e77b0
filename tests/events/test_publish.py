"""What a waited turn publishes on the event bus (Redis): a new conversation's first turn nothing
(nobody can watch an id only its response tells), a later turn its events for live watchers."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aioredis

from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_new_conversation_publishes_nothing_and_a_later_turn_its_events(
    make_client: AppFactory, llm: ScriptedLLM, redis_url: str
) -> None:
    llm.script("first", "second")
    bus = aioredis.Redis.from_url(redis_url)
    pubsub = bus.pubsub()
    await pubsub.psubscribe("sabre:events:*")
    try:
        async with make_client() as client:
            created = await client.post("/v1/conversations", json={"input": "hi"})
            assert created.status_code == 201, created.text
            conversation = created.json()["conversation_id"]
            again = await client.post(f"/v1/conversations/{conversation}/messages", json={"input": "again"})
            assert again.json()["output"] == "second", again.text
            published: list[dict[str, object]] = []
            deadline = asyncio.get_running_loop().time() + 5
            while asyncio.get_running_loop().time() < deadline:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
                if message is None:
                    if any(e["type"] == "turn.completed" for e in published):
                        break
                    continue
                if message["channel"] == f"sabre:events:{conversation}".encode():
                    published.extend(json.loads(message["data"]))
        turns = {event["turn_id"] for event in published}
        assert turns == {again.json()["turn_id"]}, published  # the first turn's events: none
        assert [e["type"] for e in published][-1] == "turn.completed"
    finally:
        await pubsub.aclose()
        await bus.aclose()
