"""Which block this process runs now: the one limit signals stop (None during the warm-up) and the
one the sandbox helpers act for (the warm-up's too). Set by ``Block.start``, cleared at its end."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.runtime.child.block import Block

current: Block | None = None
block: Block | None = None
