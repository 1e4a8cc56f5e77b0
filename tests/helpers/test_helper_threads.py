"""Helpers' blocking work runs in threads of its own, a few per tenant (app.helpers.threads).

A hung search service is the hostile case: ``ddgs`` blocks a thread until its own timeouts, and the
model can call ``Search.search`` many times at once. It ran in the event loop's default executor (six
threads on two cores), which the service's own blocking work shares, so one tenant's searches held
every thread. The search library is stubbed at its boundary (``DDGS.text``); the helper, its backend
and the threads are the real ones.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import ddgs.ddgs
import httpx
import pytest

from app.helpers import HelperContext
from app.helpers.search import configured_backend, search
from app.helpers.threads import HelperThreads, using

# A hang-detection bound, not a timing: what must answer answers at once, what hangs never would.
ANSWERS_WITHIN = 20.0


class HungService:
    """``DDGS.text``: a query starting with ``hang`` blocks until released; others answer at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.most_running = 0
        self.log: list[str] = []

    def text(self, query: str, **kwargs: Any) -> list[dict[str, str]]:
        if not query.startswith("hang"):
            return [{"title": query, "href": "https://example.com/", "body": ""}]
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            self.log.append(f"start {query}")
        try:
            self.release.wait(60)
        finally:
            with self.lock:
                self.running -= 1
                self.log.append(f"end {query}")
        return []


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[HungService]:
    hung = HungService()
    monkeypatch.setattr(ddgs.ddgs.DDGS, "text", lambda self, query, **kw: hung.text(query, **kw))
    monkeypatch.delenv("SABRE_SEARCH_BACKEND", raising=False)
    configured_backend.cache_clear()
    yield hung
    hung.release.set()
    configured_backend.cache_clear()


async def _until(condition: Any) -> None:
    deadline = time.monotonic() + ANSWERS_WITHIN
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


async def test_one_tenants_hung_searches_hold_neither_the_default_threads_nor_other_tenants(
    ctx: HelperContext, service: HungService
) -> None:
    threads = HelperThreads()
    with using(threads, "acme"):
        hung = [asyncio.create_task(search(ctx, [f"hang {i}"], {})) for i in range(12)]
    await _until(lambda: service.running == threads.per_tenant)

    # The service's own blocking work (the default executor) is not behind acme's searches.
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), ANSWERS_WITHIN) == "free"
    # Nor is another tenant's search.
    with using(threads, "globex"):
        found = await asyncio.wait_for(search(ctx, ["quick"], {}), ANSWERS_WITHIN)
    assert [hit["title"] for hit in found] == ["quick"]
    assert threads.busy("acme") == threads.per_tenant
    assert threads.busy("globex") == 0

    service.release.set()
    assert await asyncio.gather(*hung) == [[]] * 12
    assert service.most_running == threads.per_tenant  # acme never held more
    assert threads.busy("acme") == 0
    threads.close()


async def test_a_call_given_up_holds_its_tenants_thread_until_it_ends(service: HungService) -> None:
    threads = HelperThreads(threads=4, per_tenant=1)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(threads.run("acme", service.text, "hang first"), 0.2)
    assert threads.busy("acme") == 1  # the thread still runs

    second = asyncio.create_task(threads.run("acme", service.text, "hang second"))
    other = await asyncio.wait_for(threads.run("globex", service.text, "quick"), ANSWERS_WITHIN)
    assert other[0]["title"] == "quick"
    service.release.set()
    assert await asyncio.wait_for(second, ANSWERS_WITHIN) == []
    # acme's second call started only once its first thread had ended.
    assert service.log == ["start hang first", "end hang first", "start hang second", "end hang second"]
    assert threads.busy("acme") == 0
    threads.close()


async def test_a_call_cancelled_while_waiting_leaves_the_line(service: HungService) -> None:
    threads = HelperThreads(threads=4, per_tenant=1)
    first = asyncio.create_task(threads.run("acme", service.text, "hang first"))
    await _until(lambda: service.running == 1)
    second = asyncio.create_task(threads.run("acme", service.text, "hang second"))
    third = asyncio.create_task(threads.run("acme", service.text, "hang third"))
    await asyncio.sleep(0.05)  # both wait in line
    second.cancel()
    service.release.set()
    assert await asyncio.wait_for(first, ANSWERS_WITHIN) == []
    assert await asyncio.wait_for(third, ANSWERS_WITHIN) == []
    assert second.cancelled()
    assert service.log == ["start hang first", "end hang first", "start hang third", "end hang third"]
    assert threads.busy("acme") == 0
    threads.close()


async def test_a_tenants_hung_dns_lookups_hold_neither_the_default_threads_nor_other_tenants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resolving a page's host is blocking work the model controls (``Web.fetch`` of hosts whose
    name server never answers: the resolver's own timeouts outlast the fetch's). It ran in the
    default executor (``loop.getaddrinfo``), so one tenant's parallel fetches held every thread."""
    import socket

    from app.helpers.net import NetworkPolicy

    release = threading.Event()
    lock = threading.Lock()
    running = [0, 0]  # now, most

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if not str(host).startswith("hang"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port))]
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        try:
            release.wait(60)
        finally:
            with lock:
                running[0] -= 1
        raise socket.gaierror(socket.EAI_NONAME, "hung")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    policy = NetworkPolicy()
    threads = HelperThreads()
    try:
        with using(threads, "acme"):
            hung = [
                asyncio.create_task(policy.resolve(httpx.URL(f"https://hang{i}.example/"))) for i in range(12)
            ]
        await _until(lambda: running[0] == threads.per_tenant)
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), ANSWERS_WITHIN) == "free"
        with using(threads, "globex"):
            ip = await asyncio.wait_for(policy.resolve(httpx.URL("https://quick.example/")), ANSWERS_WITHIN)
        assert str(ip) == "93.184.215.14"
    finally:
        release.set()
    results = await asyncio.gather(*hung, return_exceptions=True)
    assert all(isinstance(r, Exception) for r in results)
    assert running[1] == threads.per_tenant
    threads.close()


async def test_tenants_with_hung_calls_leave_threads_for_another_until_every_share_is_held(
    service: HungService,
) -> None:
    """A hung thread cannot be stopped, so only room for every tenant's share keeps a tenant's
    call from waiting behind others' hung ones. With 8 threads, four tenants' hung searches (or
    one caller's four API keys) held them all and every other tenant's helpers queued. Now a
    newcomer's call answers at once beside four such tenants, and beside as many as leave one
    share free; once every thread is held the next tenant waits for one to end (bounded)."""
    threads = HelperThreads()
    per = threads.per_tenant
    hung: list[asyncio.Task[list[dict[str, str]]]] = []

    async def hang(tenants: range) -> None:
        hung.extend(
            asyncio.create_task(threads.run(f"tenant-{t}", service.text, f"hang {t}.{i}"))
            for t in tenants
            for i in range(per)
        )
        await _until(lambda: service.running == len(hung))

    async def answers_at_once(tenant: str) -> None:
        found = await asyncio.wait_for(threads.run(tenant, service.text, "quick"), ANSWERS_WITHIN)
        assert found[0]["title"] == "quick"

    await hang(range(4))  # what filled the 8 threads
    await answers_at_once("newcomer")
    shares = threads.threads // per
    assert shares >= 32
    await hang(range(4, shares - 1))
    await answers_at_once("another newcomer")

    await hang(range(shares - 1, shares))  # now every thread is held
    assert service.running == threads.threads
    waiting = asyncio.create_task(threads.run("one too many", service.text, "quick"))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    service.release.set()
    assert (await asyncio.wait_for(waiting, ANSWERS_WITHIN))[0]["title"] == "quick"
    assert await asyncio.gather(*hung) == [[]] * threads.threads
    assert service.most_running == threads.threads
    threads.close()
