"""Fixtures: a scripted server per test, and a real client for each wire API pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from app.llm import LLMApi, LLMClient, make_llm_client
from app.llm.scripted import ScriptedLLM

API_KEY = "sk-test-secret-4242"


@pytest.fixture
def scripted() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as llm:
        yield llm


@pytest.fixture(params=["responses", "chat"])
def api(request: pytest.FixtureRequest) -> LLMApi:
    value: LLMApi = request.param
    return value


@pytest.fixture
async def client(scripted: ScriptedLLM, api: LLMApi) -> AsyncIterator[LLMClient]:
    llm_client = make_llm_client(
        api=api,
        base_url=scripted.base_url,
        api_key=API_KEY,
        timeout=5,
        max_retries=3,
        retry_base_delay=0.01,
    )
    yield llm_client
    await llm_client.aclose()
