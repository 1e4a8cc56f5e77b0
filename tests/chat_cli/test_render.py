"""The chat's prose filter: ``<helpers>`` blocks are cut out of streamed text however the deltas split
the tags; the inline-image escapes."""

from __future__ import annotations

import base64

import pytest

from app.chat_cli.render import ProseFilter, inline_image

MESSAGE = "Let me compute.\n<helpers>\nprint(1 < 2)\n</helpers>\nDone <b>bold</b> and <helpers"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, len(MESSAGE)])
def test_blocks_are_cut_out_whatever_the_chunks(size: int) -> None:
    prose = ProseFilter()
    shown = "".join(prose.feed(MESSAGE[i : i + size]) for i in range(0, len(MESSAGE), size)) + prose.flush()
    assert shown == "Let me compute.\n\nDone <b>bold</b> and <helpers"


def test_an_unclosed_block_shows_nothing_more() -> None:
    prose = ProseFilter()
    assert prose.feed("a <helpers>x = 1") == "a "
    assert prose.flush() == ""
    assert prose.feed("next") == "next"


def test_inline_images() -> None:
    png = b"\x89PNG" + bytes(5000)
    iterm = inline_image(png, protocol="iterm")
    assert iterm.startswith("\x1b]1337;File=inline=1;")
    assert iterm.endswith("\x07")
    kitty = inline_image(png, protocol="kitty")
    chunks = kitty.split("\x1b\\")[:-1]
    assert chunks[0].startswith("\x1b_Ga=T,f=100,m=1;")
    assert chunks[-1].startswith("\x1b_Gm=0;")
    payload = "".join(chunk.split(";", 1)[1] for chunk in chunks)
    assert base64.standard_b64decode(payload) == png
