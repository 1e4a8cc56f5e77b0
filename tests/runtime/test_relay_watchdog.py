"""The worker's quota watchdog stops whenever it is told to, whatever it was doing at that moment.

It once slept for ever when the stop came between its look at the block's phase and its sleep:
the relay then joined it for ever, the worker never reported the block's end, and the server ended
the block by its wall clock 30 s later (a block that should have failed at once; seen under load in
several hostile-block tests). The interleaving is forced here, on a real ``ChildLink`` over a real
process, socket and pipe.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from app.runtime.relay import ChildLink


@pytest.fixture
def link() -> Iterator[ChildLink]:
    """A ChildLink on a sleeping process, between two blocks as far as its watchdog knows."""
    process = subprocess.Popen(["sleep", "60"])
    ours, theirs = socket.socketpair()
    output_read, output_write = os.pipe()
    server_read, server_write = os.pipe()
    server_in = io.FileIO(server_read, "rb")
    child = ChildLink(
        pid=process.pid,
        channel=ours.detach(),
        output=output_read,
        server_in=server_in,
        server_out=server_write,
    )
    try:
        yield child
    finally:
        process.kill()
        process.wait()
        child.close()
        for handle in (theirs, server_in):
            handle.close()
        for fd in (output_write, server_write):
            os.close(fd)


class _StopJustAfterTheTimedWait(threading.Event):
    """The watchdog's stop event: its first timed wait ends (the interval is over) just after
    another thread stopped the watchdog, as the relay does when its child is dead."""

    def __init__(self, link: ChildLink) -> None:
        super().__init__()
        self._link = link
        self.stopper: threading.Thread | None = None

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None or self.stopper is not None:
            return super().wait(timeout)
        stopper = threading.Thread(target=self._link.stop_watchdog, daemon=True)
        stopper.start()
        self.stopper = stopper  # started: the test may join it
        deadline = time.monotonic() + 5
        while not self.is_set() and time.monotonic() < deadline:
            time.sleep(0.001)
        with self._link._quota_lock:  # the stopper is past what it does under the lock, if anything
            pass
        return False  # as if the interval ran out just before the stop


def test_a_stop_between_the_watchdogs_look_and_its_sleep_still_stops_it(link: ChildLink) -> None:
    stop = _StopJustAfterTheTimedWait(link)
    link._stop = stop
    link._phase = "done"  # the block has ended: the watchdog goes back to sleep after its look
    link._running.set()
    watchdog = link._start_watchdog()
    deadline = time.monotonic() + 5
    while stop.stopper is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert stop.stopper is not None, "the watchdog never waited out an interval"
    stop.stopper.join(timeout=3)
    assert not stop.stopper.is_alive(), "stopping the watchdog hung: it went back to sleep past its stop"
    assert not watchdog.is_alive()


def test_a_watchdog_asleep_between_blocks_stops_at_once(link: ChildLink) -> None:
    watchdog = link._start_watchdog()  # never told of a block: asleep
    began = time.monotonic()
    link.stop_watchdog()
    assert not watchdog.is_alive()
    assert time.monotonic() - began < 1.0
