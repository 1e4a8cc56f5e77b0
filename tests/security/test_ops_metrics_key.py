"""Who may read ``/metrics`` on the API port when ``SABRE_METRICS_KEY`` is set but empty.

Compose files pass unset variables as ``''`` (``SABRE_METRICS_KEY: ${SABRE_METRICS_KEY:-}``), and
other empty settings mean unset. An empty metrics key was a key, though: ``Authorization: Bearer ``
(a trailing space, which uvicorn's httptools parser keeps) matched it, so anyone read the metrics
of a server with API keys."""

from __future__ import annotations

import pytest

from tests.conftest import AppFactory


@pytest.mark.parametrize("key", ["", "   "])
async def test_an_empty_metrics_key_opens_nothing(make_client: AppFactory, key: str) -> None:
    async with make_client(api_keys="acme:key-acme", metrics_key=key) as client:
        for sent in ("Bearer ", f"Bearer {key}", "Bearer", ""):
            response = await client.get("/metrics", headers={"Authorization": sent})
            assert response.status_code == 404, (sent, response.status_code)


async def test_the_metrics_key_is_still_required_and_enough(make_client: AppFactory) -> None:
    async with make_client(api_keys="acme:key-acme", metrics_key="m-key") as client:
        assert (await client.get("/metrics", headers={"Authorization": "Bearer m-key"})).status_code == 200
        for sent in ("Bearer ", "Bearer m-ke", "Bearer m-key2", "Bearer key-acme", "m-key", ""):
            response = await client.get("/metrics", headers={"Authorization": sent})
            assert response.status_code == 401, sent
