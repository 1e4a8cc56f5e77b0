"""Metric labels an unauthenticated caller can choose: the HTTP method is any token the client
sends (``FOO``, ``X1``, …), and each distinct one made a new series of
``sabre_http_requests_total`` and ``sabre_http_request_seconds`` that the process keeps forever."""

from __future__ import annotations

import re

from tests.conftest import AppFactory

_METHOD = re.compile(r'sabre_http_requests_total\{[^}]*method="([^"]*)"')


async def test_made_up_methods_do_not_add_metric_series(make_client: AppFactory) -> None:
    async with make_client(metrics_key="metrics-secret") as client:
        await client.get("/healthz")
        for n in range(50):
            await client.request(f"BOGUS{n}", "/v1/conversations")
            await client.request(f"X{n}", "/nowhere")
        scrape = await client.get("/metrics", headers={"Authorization": "Bearer metrics-secret"})
        assert scrape.status_code == 200
        methods = set(_METHOD.findall(scrape.text))
        assert not any(m.startswith(("BOGUS", "X")) for m in methods), sorted(methods)[:10]
        assert "_OTHER" in methods
        assert "GET" in methods
