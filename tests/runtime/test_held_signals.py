"""How a live process holds signals between its blocks (``child.process``): held ones reach their
handlers when the next block restores the mask, the last block's own limit signals are dropped."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from app.runtime.child.process import hold_signals, restore_signals


@pytest.fixture
def handled() -> Iterator[list[str]]:
    got: list[str] = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGALRM, signal.SIGUSR1)}
    signal.signal(signal.SIGALRM, lambda *_: got.append("SIGALRM"))
    signal.signal(signal.SIGUSR1, lambda *_: got.append("SIGUSR1"))
    try:
        yield got
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_held_signals_come_at_the_restore_and_limit_signals_are_dropped(handled: list[str]) -> None:
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    mask = hold_signals()
    assert signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    os.kill(os.getpid(), signal.SIGALRM)  # as if the last block's wall clock fired as it ended
    os.kill(os.getpid(), signal.SIGUSR1)
    assert handled == []  # nothing runs while held
    restore_signals(mask, drop=(signal.SIGALRM, signal.SIGXCPU))
    assert handled == ["SIGUSR1"]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == unblocked


def test_without_drop_every_held_signal_comes(handled: list[str]) -> None:
    mask = hold_signals()
    os.kill(os.getpid(), signal.SIGALRM)
    restore_signals(mask)
    assert handled == ["SIGALRM"]
