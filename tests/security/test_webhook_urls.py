"""Webhook URLs with a port no TCP connection can use (attacker pass on webhooks).

``httpx`` parses ``http://host:99999/`` and ``http://host:-1/`` without complaint, so such a
``webhook_url`` was accepted (201) and stored; each delivery then failed outside the fetch helpers'
errors (an ``ExceptionGroup`` from the connect), so the job died with an unexpected exception instead
of the logged, classified failure the README promises. A port must be 1-65535, checked with the
rest of the URL's shape (422), for a conversation's URL and for ``SABRE_WEBHOOK_URLS`` alike."""

from __future__ import annotations

import httpx
import pytest

from app.events.webhooks import check_webhook_url
from app.wiring import StartupError
from tests.conftest import AppFactory

BAD_PORTS = ["http://example.com:99999/hook", "http://example.com:-1/hook", "https://example.com:0/hook"]


@pytest.mark.parametrize("url", BAD_PORTS)
async def test_a_webhook_url_with_an_impossible_port_is_422(client: httpx.AsyncClient, url: str) -> None:
    response = await client.post("/v1/conversations", json={"input": "hi", "webhook_url": url})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "port" in response.text


@pytest.mark.parametrize("url", BAD_PORTS)
async def test_a_default_webhook_url_with_an_impossible_port_stops_the_start(
    make_client: AppFactory, url: str
) -> None:
    with pytest.raises(StartupError, match="port"):
        async with make_client(webhook_urls=f"local={url}"):
            pass


def test_ports_in_range_are_accepted() -> None:
    for url in ("http://example.com:1/", "https://example.com:65535/x", "https://example.com/"):
        assert check_webhook_url(url) == url
