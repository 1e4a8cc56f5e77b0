"""One live ``sabre serve`` (SQLite, API keys required, the demo scripted model) for the client
tests of a module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.llm.scripted import ScriptedLLM
from tests.live_server import demo_responder, sabre_server

API_KEY = "sk-clients-test"


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a ``sabre serve`` that takes ``API_KEY``."""
    with (
        ScriptedLLM(responder=demo_responder) as llm,
        sabre_server(
            data_dir=tmp_path_factory.mktemp("clients"), llm_url=llm.base_url, api_keys=f"clients:{API_KEY}"
        ) as url,
    ):
        yield url
