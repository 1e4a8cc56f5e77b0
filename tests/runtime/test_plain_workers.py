"""Plain workers beside the preloaded ones (``RuntimePool(plain_size=...)``): a block that names
no preloaded module runs in a fork of a zygote that imported nothing, one that does (or whose
namespace refers to one) on the preloaded workers, and a conversation moves between them with
its state. ``colorsys`` and ``wave`` stand in for numpy and pandas: quick to preload, and the
runtime itself imports neither."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
import pytest_asyncio

from app.runtime import CallReply, JournalEntry, RuntimePool
from app.runtime.isolation import Backend
from tests.runtime.support import BACKENDS, Recorder, run, started_pool

pytestmark = pytest.mark.asyncio(loop_scope="module")

PRELOAD = ("colorsys", "wave")
# Whether the block's process holds the preloads: ``wave`` is named by no block below, so only a
# preloaded worker has it (the string is split so that it names no preloaded module itself).
PRELOADED = "import sys\nresult('wa' + 've' in sys.modules)\n"


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=BACKENDS)
async def tiers(request: pytest.FixtureRequest, workspaces: Path) -> AsyncIterator[RuntimePool]:
    """One preloaded and one plain worker kept free; processes stay bound for 30 s."""
    async with started_pool(
        request.param, workspaces, preload=PRELOAD, size=1, plain_size=1, live_seconds=30.0, live_processes=4
    ) as pool:
        yield pool


def conversation(workspaces: Path) -> Path:
    return Path(tempfile.mkdtemp(prefix="tiers-", dir=workspaces))


async def test_a_block_runs_on_the_workers_its_code_needs(tiers: RuntimePool, workspaces: Path) -> None:
    plain = await run(tiers, "x = 1\n" + PRELOADED, workdir=conversation(workspaces))
    assert (plain.status, plain.results) == ("ok", ["False"]), plain.error
    needs = await run(tiers, "import colorsys\n" + PRELOADED, workdir=conversation(workspaces))
    assert (needs.status, needs.results) == ("ok", ["True"]), needs.error
    assert tiers.plain is not None
    assert tiers.plain.zygotes  # two zygotes: one without the preloads
    assert tiers.workers.zygotes
    assert not {z.proc.pid for z in tiers.plain.zygotes} & {z.proc.pid for z in tiers.workers.zygotes}


async def test_a_conversation_moves_to_the_preloaded_workers_with_its_state(
    tiers: RuntimePool, workspaces: Path
) -> None:
    workdir = conversation(workspaces)
    first = await run(tiers, "rows = [1, 2]\n" + PRELOADED, workdir=workdir)
    assert (first.status, first.results, first.process) == ("ok", ["False"], "fresh"), first.error
    # Its live process is plain: a block that needs the preloads starts fresh from the snapshot.
    second = await run(
        tiers,
        "import colorsys\nrows.append(3)\nresult(rows)\n" + PRELOADED,
        workdir=workdir,
        snapshot=first.snapshot,
    )
    assert (second.status, second.process) == ("ok", "fresh"), second.error
    assert second.results == ["[1, 2, 3]", "True"]
    # A preloaded process runs any block: the next one, which needs nothing, runs live in it.
    third = await run(tiers, "result(len(rows))\n" + PRELOADED, workdir=workdir, snapshot=second.snapshot)
    assert (third.status, third.process, third.results) == ("ok", "live", ["3", "True"]), third.error


async def test_a_namespace_that_refers_to_a_preloaded_module_is_restored_on_preloaded_workers(
    tiers: RuntimePool, workspaces: Path
) -> None:
    """A snapshot that pickled a module (or an object of its) imports it when restored: such a
    conversation stays on the workers that hold it, even for a block that names nothing."""
    first = await run(tiers, "import colorsys\nc = colorsys\n", workdir=conversation(workspaces))
    assert first.status == "ok", first.error
    assert first.snapshot is not None
    # Another directory: nothing is bound to it, so the block restores the snapshot in a fresh fork.
    restored = await run(
        tiers, "result(c.__name__)\n" + PRELOADED, workdir=conversation(workspaces), snapshot=first.snapshot
    )
    assert (restored.status, restored.process) == ("ok", "fresh"), restored.error
    assert restored.results == ["colorsys", "True"]


async def test_a_block_paused_on_a_plain_worker_resumes_in_its_process(
    tiers: RuntimePool, workspaces: Path
) -> None:
    workdir = conversation(workspaces)
    code = "order = lookup(order_id='A1')\nresult(order['status'])\n" + PRELOADED
    tools = {"lookup": ["order_id"]}
    paused = await run(
        tiers, code, workdir=workdir, tools=tools, on_call=Recorder(lambda call: CallReply(kind="suspend"))
    )
    assert paused.status == "suspended", paused.error
    assert paused.pending is not None
    answer = JournalEntry.for_call(paused.pending, CallReply(kind="value", value={"status": "shipped"}))
    resumed = await run(tiers, code, workdir=workdir, tools=tools, journal=[*paused.journal, answer])
    assert (resumed.status, resumed.process) == ("ok", "resumed"), resumed.error
    assert resumed.results == ["shipped", "False"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_closing_the_pool_ends_both_zygotes(backend: str, workspaces: Path) -> None:
    async with started_pool(cast(Backend, backend), workspaces, preload=PRELOAD, plain_size=1) as pool:
        assert pool.plain is not None
        assert pool.idle_workers == 3  # the two preloaded workers and the plain one
        zygotes = [z.proc for z in (*pool.workers.zygotes, *pool.plain.zygotes)]
        assert len(zygotes) == 2
    for proc in zygotes:
        assert proc.returncode is not None
        with pytest.raises(ProcessLookupError):
            os.kill(proc.pid, 0)


async def test_a_pool_without_preloads_has_no_plain_workers_apart(workspaces: Path) -> None:
    """Every worker is plain already: ``plain_size`` adds nothing."""
    async with started_pool("process", workspaces, plain_size=2) as pool:
        assert pool.plain is None
        assert pool.supervisor("plain") is pool.workers
