"""A tenant cannot hold event streams open without bound.

Each SSE stream (``GET …/events`` with ``Accept: text/event-stream``, ``follow=true`` keeping it
open for hours, or a streamed POST and its idempotent replays) holds a socket, tasks and a bus
subscription, and without a bus across processes reads the store every 0.25 s. Only the request
that opens one passed the rate limit, so a tenant opening one after another held more and more of
the process that every tenant shares. ``SABRE_MAX_EVENT_STREAMS`` caps them per tenant (429
``concurrent_streams_limited``); a stream's place comes back when it ends.

The streams are held over real HTTP (an in-process uvicorn on the test's app): the ASGI test
transport answers only once a response is complete, and these never are.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn

from app.events.schemas import EventOut
from app.events.sse import event_stream
from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory

KEYS = "acme:key-acme-123,globex:key-globex-456"
ACME = {"Authorization": "Bearer key-acme-123"}
GLOBEX = {"Authorization": "Bearer key-globex-456"}
SSE = {"Accept": "text/event-stream"}


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """``app`` (its lifespan already running) served on a free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)


async def test_a_tenant_holds_at_most_its_event_streams_and_gets_them_back(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    llm.script("hello acme", "hello globex")
    async with make_client(api_keys=KEYS, max_event_streams=2) as client:
        acme_conv = (await client.post("/v1/conversations", json={"input": "hi"}, headers=ACME)).json()[
            "conversation_id"
        ]
        globex_conv = (await client.post("/v1/conversations", json={"input": "hi"}, headers=GLOBEX)).json()[
            "conversation_id"
        ]
        async with served(client.app) as base, httpx.AsyncClient(base_url=base, timeout=10) as http:  # type: ignore[attr-defined]
            acme_url = f"/v1/conversations/{acme_conv}/events?follow=true"
            async with contextlib.AsyncExitStack() as streams:
                first = await streams.enter_async_context(
                    http.stream("GET", acme_url, headers={**SSE, **ACME})
                )
                assert first.status_code == 200
                async with http.stream("GET", acme_url, headers={**SSE, **ACME}) as second:
                    assert second.status_code == 200
                    async with http.stream("GET", acme_url, headers={**SSE, **ACME}) as third:
                        assert third.status_code == 429  # before: 200, a third stream held open
                        await third.aread()
                    assert third.json()["code"] == "concurrent_streams_limited"
                    assert third.headers["Retry-After"] == "1"
                    # A streamed POST is a stream too: refused before it starts a turn.
                    posted = await http.post(
                        f"/v1/conversations/{acme_conv}/messages",
                        json={"input": "again", "stream": True},
                        headers=ACME,
                    )
                    assert posted.status_code == 429, posted.text
                    assert posted.json()["code"] == "concurrent_streams_limited"
                    # Another tenant's streams are its own.
                    async with http.stream(
                        "GET",
                        f"/v1/conversations/{globex_conv}/events?follow=true",
                        headers={**SSE, **GLOBEX},
                    ) as theirs:
                        assert theirs.status_code == 200
                    # The JSON page is no stream.
                    page = await http.get(f"/v1/conversations/{acme_conv}/events", headers=ACME)
                    assert page.status_code == 200
                # The closed stream's place comes back (once the server has seen it go).
                for _ in range(100):
                    again = await streams.enter_async_context(
                        http.stream("GET", acme_url, headers={**SSE, **ACME})
                    )
                    if again.status_code == 200:
                        break
                    await again.aread()
                    await asyncio.sleep(0.05)
                assert again.status_code == 200
    assert len(llm.requests) == 2  # the refused streamed POST ran no turn


async def _no_events() -> AsyncIterator[EventOut]:
    return
    yield  # an async generator that yields nothing


def test_a_stream_dropped_before_it_is_sent_gives_its_place_back() -> None:
    # Between the endpoint and the send (a commit of the request's session that fails, say) the
    # response may never run: its place must not stay taken for the process's life.
    closed: list[int] = []
    response = event_stream(_no_events(), on_close=lambda: closed.append(1))
    del response
    gc.collect()
    assert closed == [1]
