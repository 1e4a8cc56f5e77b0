"""The loop's watch on the model's stream for an opening ``<helpers>`` tag (when it readies the
conversation's process for the block, ``RuntimePool.prepare``)."""

from __future__ import annotations

import pytest

from app.orchestrator.loop import _watch_for_block


async def feed(pieces: list[str], *, forward: bool = True) -> tuple[int, list[str]]:
    """Stream ``pieces``: how often the watch fired, and what it passed on."""
    opened: list[None] = []
    passed: list[str] = []

    async def sink(text: str) -> None:
        passed.append(text)

    watch = _watch_for_block(sink if forward else None, lambda: opened.append(None))
    for piece in pieces:
        await watch(piece)
    return len(opened), passed


@pytest.mark.parametrize(
    "pieces",
    [
        ["Let me look.\n<helpers>\nprint(1)\n</helpers>"],
        ["Let me look.\n<hel", "pers>\nprint(1)"],  # the tag split across two pieces
        ["<", "h", "e", "l", "p", "e", "r", "s", ">", "x = 1"],
        ["<helpers>", "\nx = 1\n</helpers>", "<helpers>\ny = 2\n</helpers>"],  # once per answer
    ],
)
async def test_an_opened_block_fires_once(pieces: list[str]) -> None:
    fired, passed = await feed(pieces)
    assert fired == 1
    assert passed == pieces  # every piece still reaches the sink, unchanged


@pytest.mark.parametrize(
    "pieces",
    [
        ["No code is needed: 1 + 1 is 2."],
        ["<help", "ers are described below", "</helpers>"],  # a closing tag opens nothing
        ["<helper>", "s>"],
    ],
)
async def test_prose_fires_nothing(pieces: list[str]) -> None:
    fired, _ = await feed(pieces, forward=False)
    assert fired == 0
