"""How a live process holds signals between its blocks (``child.process``): held ones reach their
handlers when the next block restores the mask, the last block's own limit signals are dropped; and
no block inherits a mask from whatever started the sandbox."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.runtime import Limits
from app.runtime.child.process import hold_signals, restore_signals
from app.runtime.isolation import Backend
from tests.runtime.support import BACKENDS, conversation, run, started_pool


@pytest.fixture
def handled() -> Iterator[list[str]]:
    """Handlers that note SIGALRM and SIGUSR1; this thread's mask and handlers as they were after."""
    got: list[str] = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGALRM, signal.SIGUSR1)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    signal.signal(signal.SIGALRM, lambda *_: got.append("SIGALRM"))
    signal.signal(signal.SIGUSR1, lambda *_: got.append("SIGUSR1"))
    try:
        yield got
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _to_this_thread(sig: signal.Signals) -> None:
    """A signal for this thread only (the test runner may have others, which would take a signal
    sent to the process while this one holds it)."""
    signal.pthread_kill(threading.get_ident(), sig)


def test_held_signals_come_at_the_restore_and_limit_signals_are_dropped(handled: list[str]) -> None:
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    mask = hold_signals()
    assert signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    _to_this_thread(signal.SIGALRM)  # as if the last block's wall clock fired as it ended
    _to_this_thread(signal.SIGUSR1)
    assert handled == []  # nothing runs while held
    restore_signals(mask, drop=(signal.SIGALRM, signal.SIGXCPU))
    assert handled == ["SIGUSR1"]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == unblocked


def test_without_drop_every_held_signal_comes(handled: list[str]) -> None:
    mask = hold_signals()
    _to_this_thread(signal.SIGALRM)
    restore_signals(mask)
    assert handled == ["SIGALRM"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_blocks_never_inherit_a_blocked_mask(backend: Backend, workspaces: Path) -> None:
    """A sandbox started by a thread that blocks signals: its blocks still get their limit signals
    (here the wall clock's, as SIGALRM) and an empty mask."""
    workdir = conversation(workspaces)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        async with started_pool(backend, workspaces, size=1) as pool:
            seen = await run(
                pool, "import signal\nresult(sorted(signal.pthread_sigmask(0, [])))", workdir=workdir
            )
            stopped = await run(
                pool, "while True:\n    pass", workdir=workdir, limits=Limits(wall_clock_seconds=1)
            )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert (seen.status, seen.results) == ("ok", ["[]"]), seen.error
    assert (stopped.status, stopped.limit) == ("limit", "wall_clock 1s")
