"""Blocking helper work in threads of its own, a few per tenant at a time.

The helpers' blocking work (the ``ddgs`` search library's network calls, parsing a fetched page or
PDF, writing a download) ran in the event loop's default executor: min(32, cores + 4) threads, six
on two cores, which the service's own blocking work shares (a sandbox worker's user namespace and
cgroups). A model calling ``Search.search`` in parallel held all of them for as long as the search
service took (ddgs goes on after asyncio stops waiting for it): every tenant's next sandbox worker,
search and page waited behind one tenant's model.

Now a ``HelperThreads`` pool (one per app) runs that work, and a tenant has at most ``PER_TENANT``
of its threads busy: its further calls wait for one of its own to end, while other tenants' calls
go on. A call whose caller stopped waiting (a timeout) keeps its tenant's slot until its thread
really ends. The pool starts a thread only when a call is let in and none is idle, up to
``THREADS``: a thread that hangs cannot be stopped, so what keeps a tenant's calls from waiting
behind others' hung ones is room for every tenant's share. With 8 threads, four tenants with hung
searches (or one caller holding four API keys) held them all; at 64 it takes 32 tenants. Threads
are started only as many as calls ever ran at once, and then stay, idle (a blocked thread, a few
KiB each). The turn loop says whose work runs (``using``); ``run_blocking`` is what helpers call
instead of ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Final, TypeVar

THREADS: Final = 64
PER_TENANT: Final = 2

_T = TypeVar("_T")


class HelperThreads:
    """A thread pool for helpers' blocking work, shared fairly between tenants: at most
    ``threads`` at once (started as calls need them), ``per_tenant`` of them per tenant."""

    def __init__(self, *, threads: int = THREADS, per_tenant: int = PER_TENANT) -> None:
        if threads < 1 or per_tenant < 1:
            raise ValueError("threads and per_tenant must be at least 1")
        self.threads = threads
        self.per_tenant = per_tenant
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sabre-helper")
        self._busy: dict[str, int] = {}  # tenant -> its calls whose thread has not ended
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def busy(self, tenant: str) -> int:
        """How many threads ``tenant``'s calls hold now."""
        return self._busy.get(tenant, 0)

    async def run(self, tenant: str, call: Callable[..., _T], /, *args: object) -> _T:
        """``call(*args)`` in a thread of the pool, once ``tenant`` holds fewer than
        ``per_tenant`` of them (context variables carried, as ``asyncio.to_thread`` does)."""
        loop = asyncio.get_running_loop()
        while self.busy(tenant) >= self.per_tenant:
            turn: asyncio.Future[None] = loop.create_future()
            line = self._waiting.setdefault(tenant, deque())
            line.append(turn)
            try:
                await turn
            except BaseException:
                if turn.done() and not turn.cancelled():  # woken, then cancelled: pass it on
                    self._wake(tenant)
                raise
            finally:
                if turn in line:
                    line.remove(turn)
                if not line and self._waiting.get(tenant) is line:
                    del self._waiting[tenant]
        self._busy[tenant] = self.busy(tenant) + 1
        context = contextvars.copy_context()
        try:
            future = loop.run_in_executor(self._executor, functools.partial(context.run, call, *args))
        except BaseException:
            self._release(tenant)
            raise
        future.add_done_callback(lambda _: self._release(tenant))
        # The thread cannot be stopped: a caller who stops waiting leaves it running, still
        # counted against its tenant until it ends (the done callback).
        return await asyncio.shield(future)

    def _release(self, tenant: str) -> None:
        left = self.busy(tenant) - 1
        if left > 0:
            self._busy[tenant] = left
        else:
            self._busy.pop(tenant, None)
        self._wake(tenant)

    def _wake(self, tenant: str) -> None:
        """Let the first of ``tenant``'s waiting calls look again for a slot."""
        line = self._waiting.get(tenant)
        while line:
            turn = line.popleft()
            if not turn.done():
                turn.set_result(None)
                return

    def close(self) -> None:
        """Stop taking work; threads running finish on their own (they are never joined)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


_current: contextvars.ContextVar[tuple[HelperThreads, str]] = contextvars.ContextVar("sabre_helper_threads")
_fallback: HelperThreads | None = None


@contextmanager
def using(threads: HelperThreads, tenant: str) -> Iterator[None]:
    """Helpers called within (and in tasks started within) run their blocking work in
    ``threads`` as ``tenant``'s."""
    token = _current.set((threads, tenant))
    try:
        yield
    finally:
        _current.reset(token)


def bound() -> bool:
    """Whether a turn bound its tenant's helper threads here (``using``)."""
    return _current.get(None) is not None


async def run_blocking(call: Callable[..., _T], /, *args: object) -> _T:
    """``call(*args)`` in the helper threads of the running turn's tenant; outside a turn (a
    helper called on its own, in tests or tools), in a process-wide pool as tenant ``""``."""
    global _fallback
    bound = _current.get(None)
    if bound is None:
        if _fallback is None:
            _fallback = HelperThreads()
        bound = (_fallback, "")
    threads, tenant = bound
    return await threads.run(tenant, call, *args)
