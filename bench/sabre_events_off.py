"""``sabre serve`` whose turn events can be switched off: the counterfactual ``bench/events_bench.py``
measures a turn's events against. For that benchmark only; the service has no such switch.

Run: ``python -m bench.sabre_events_off serve --port P`` (the arguments of ``python -m app.cli``).

What "off" means, patched in this process (uvicorn runs the app in it: one web worker):
``TurnRecorder`` still numbers and collects a turn's events in memory (the turn loop calls it), but

- ``write``: never writes them (no flush transaction while the turn runs, nothing added to the
  turn's final transaction), so there is nothing to publish either;
- ``publish``: writes them but never publishes them;
- ``last_seq``: ``EventRepository.last_seq`` answers 0 without a query (streamed and background
  turns read their first seq so). A waited turn reads it as a subquery of its one state statement
  (``ConversationRepository.turn_state``), which stays: an index-only ``max(seq)``, measured
  apart in section 2d of the benchmark.

``SABRE_BENCH_EVENTS_OFF`` names the parts (default ``write,publish,last_seq``: all of them). With
``SABRE_BENCH_EVENTS_TOGGLE=FILE`` the server starts with events on, as the service is, and SIGUSR1
switches the parts off, SIGUSR2 on again; each switch writes ``off`` or ``on`` to FILE once it holds,
so the benchmark compares both in one process. Without it, the parts are off from the start.
Switch only while no turn runs. The events endpoints of a server with events off show nothing new.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.events.recorder import TurnRecorder
from app.events.repository import EventRepository

PARTS = ("write", "publish", "last_seq")


def _no_flush(self: TurnRecorder) -> None:
    """Never schedule a write while the turn runs."""


async def _drain_nothing(self: TurnRecorder, session: AsyncSession) -> list[dict[str, Any]]:
    """Drop what was recorded instead of adding it to the turn's final transaction."""
    self._pending = []
    return []


async def _publish_nothing(self: TurnRecorder, rows: Any) -> None:
    """Tell nobody."""


async def _no_last_seq(self: EventRepository, *, conversation_id: str) -> int:
    return 0


class Switch:
    """The named parts' methods, original or replaced."""

    def __init__(self, parts: set[str], state_file: Path | None) -> None:
        replacements: list[tuple[type, str, Any]] = []
        if "write" in parts:
            replacements += [(TurnRecorder, "_schedule", _no_flush), (TurnRecorder, "drain", _drain_nothing)]
        if "publish" in parts:
            replacements.append((TurnRecorder, "publish", _publish_nothing))
        if "last_seq" in parts:
            replacements.append((EventRepository, "last_seq", _no_last_seq))
        self._patches = [(owner, name, getattr(owner, name), new) for owner, name, new in replacements]
        self._state_file = state_file

    def set(self, off: bool) -> None:
        for owner, name, original, replacement in self._patches:
            setattr(owner, name, replacement if off else original)
        if self._state_file is not None:
            self._state_file.write_text("off" if off else "on")


def main() -> None:
    parts = {p for p in os.environ.get("SABRE_BENCH_EVENTS_OFF", ",".join(PARTS)).split(",") if p}
    unknown = parts - set(PARTS)
    if unknown:
        raise SystemExit(f"SABRE_BENCH_EVENTS_OFF: unknown part(s) {sorted(unknown)}; known: {PARTS}")
    toggle = os.environ.get("SABRE_BENCH_EVENTS_TOGGLE")
    switch = Switch(parts, Path(toggle) if toggle else None)
    if toggle:
        switch.set(False)
        signal.signal(signal.SIGUSR1, lambda *_: switch.set(True))
        signal.signal(signal.SIGUSR2, lambda *_: switch.set(False))
    else:
        switch.set(True)
    from app.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
