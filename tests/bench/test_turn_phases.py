"""bench/turn_phases.py's arithmetic on a made-up trace: span paths summed per request, a span's own
time as its length minus the union of its children (overlaps counted once), other traces ignored."""

from __future__ import annotations

from bench.turn_phases import OWN, Span, covered, profile

MS = 1_000_000  # ns


def span(name: str, ident: int, parent: int, start: float, end: float) -> Span:
    parent_id = bytes([parent]) if parent else b""
    return Span(b"t", bytes([ident]), parent_id, name, int(start * MS), int(end * MS))


def test_covered_counts_overlaps_once() -> None:
    spans = [span("a", 1, 0, 0, 4), span("b", 2, 0, 2, 6), span("c", 3, 0, 10, 11)]
    assert covered(spans) == 7 * MS


def test_profile_sums_paths_and_own_time() -> None:
    trace = [
        span("POST /v1/conversations", 1, 0, 0, 20),
        span("turn.prepare", 2, 1, 1, 3),
        span("store SELECT conversations", 3, 2, 1, 2),
        span("turn", 4, 1, 3, 13),
        span("iteration", 5, 4, 3, 13),
        span("llm.call", 6, 5, 3, 6),
        span("block", 7, 5, 6, 12),
        span("store INSERT events", 8, 1, 14, 15),
        span("store INSERT messages", 9, 1, 15, 17),
    ]
    order: dict[tuple[str, ...], int] = {}
    found = profile(trace, order)
    assert found is not None
    kind, totals = found
    assert kind == "start"
    assert totals[()] == [20.0, 1]
    assert totals[("turn.prepare", "store SELECT")] == [1.0, 1]
    assert totals[("turn.prepare", OWN)][0] == 1.0
    assert totals[("turn", "iteration", "block")] == [6.0, 1]
    assert totals[("turn", "iteration", OWN)][0] == 1.0
    assert totals[("store INSERT",)] == [3.0, 2]  # two statements by verb, summed
    assert totals[(OWN,)][0] == 20 - 2 - 10 - 3  # the request in none of its children
    assert order[("turn.prepare",)] < order[("turn",)] < order[("store INSERT",)]


def test_profile_ignores_other_traces() -> None:
    assert profile([span("store SELECT x", 1, 0, 0, 1)], {}) is None
    assert profile([span("GET /v1/conversations", 1, 0, 0, 1)], {}) is None
