"""Helpers of the runtime tests: a recording ``on_call`` and ``run_block`` with defaults."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from app.runtime import BlockOutcome, CallReply, HelperCall, JournalEntry, Limits, RuntimePool


class Recorder:
    """An ``on_call`` that records every call it gets and answers with ``answer``."""

    def __init__(self, answer: Callable[[HelperCall], CallReply] | None = None) -> None:
        self.calls: list[HelperCall] = []
        self._answer = answer or (lambda call: CallReply(kind="value", value=None))

    async def __call__(self, call: HelperCall) -> CallReply:
        self.calls.append(call)
        return self._answer(call)


async def run(
    pool: RuntimePool,
    code: str,
    *,
    workdir: Path,
    snapshot: bytes | None = None,
    limits: Limits | None = None,
    helpers: Sequence[str] = (),
    tools: Mapping[str, Sequence[str]] | None = None,
    journal: Sequence[JournalEntry] = (),
    on_call: Recorder | None = None,
) -> BlockOutcome:
    """``pool.run_block`` with test defaults."""
    return await pool.run_block(
        code=code,
        snapshot=snapshot,
        workdir=workdir,
        limits=limits or Limits(),
        internal_helpers=helpers,
        external_tools=tools or {},
        journal=journal,
        on_call=on_call or Recorder(),
    )
