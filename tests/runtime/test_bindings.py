"""``Bindings``: which processes stay bound to their conversation, on their own (no sandbox runs).
The same rules run end to end in test_parking.py and test_live.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from app.runtime.bound import Bindings, Bound
from app.runtime.schemas import Limits
from app.runtime.tiers import Tier

CAPACITY = 2


def _bound(*, parked: bool = False, memory_kb: int = 0, tier: Tier = "preloaded") -> Bound:
    """A bound process; its worker and exchange are stand-ins Bindings never touches."""
    return Bound(
        worker=cast(Any, object()),
        limits=Limits(),
        blocks=1,
        tier=tier,
        exchange=cast(Any, object()) if parked else None,
        memory_kb=memory_kb,
    )


class Released:
    """The ``let_go`` callback: what was released, in order."""

    def __init__(self) -> None:
        self.bounds: list[Bound] = []

    def __call__(self, bound: Bound) -> None:
        self.bounds.append(bound)


def _bindings(*, seconds: float = 60.0, memory_kb: int = 1000) -> tuple[Bindings, Released]:
    released = Released()
    return Bindings(seconds=seconds, memory_kb=memory_kb, let_go=released), released


async def test_the_least_recently_used_live_process_gives_way_first() -> None:
    bindings, released = _bindings()
    parked, live, newer = _bound(parked=True), _bound(), _bound()
    assert bindings.keep(Path("/w/a"), parked, capacity=CAPACITY)
    assert bindings.keep(Path("/w/b"), live, capacity=CAPACITY)
    assert bindings.keep(Path("/w/c"), newer, capacity=CAPACITY)
    # The parked block is older, but a live process goes before a paused block.
    assert released.bounds == [live]
    assert (bindings.parked, bindings.live) == (1, 1)
    assert bindings.take(Path("/w/b")) is None
    assert bindings.take(Path("/w/a")) is parked


async def test_a_live_process_is_not_kept_when_every_bound_one_holds_a_paused_block() -> None:
    bindings, released = _bindings()
    first, second, live = _bound(parked=True), _bound(parked=True), _bound()
    assert bindings.keep(Path("/w/a"), first, capacity=CAPACITY)
    assert bindings.keep(Path("/w/b"), second, capacity=CAPACITY)
    assert not bindings.keep(Path("/w/c"), live, capacity=CAPACITY)
    assert released.bounds == [live]
    # A paused block does displace the least recently used paused one (its resume replays).
    third = _bound(parked=True)
    assert bindings.keep(Path("/w/c"), third, capacity=CAPACITY)
    assert released.bounds == [live, first]
    assert bindings.parked == 2


async def test_live_processes_share_the_memory_budget() -> None:
    bindings, released = _bindings(memory_kb=1000)
    greedy = _bound(memory_kb=1001)
    assert not bindings.keep(Path("/w/a"), greedy, capacity=CAPACITY)  # it alone holds more
    older, newer = _bound(memory_kb=600), _bound(memory_kb=600)
    assert bindings.keep(Path("/w/b"), older, capacity=CAPACITY)
    assert bindings.keep(Path("/w/c"), newer, capacity=CAPACITY)  # together over: the older goes
    assert released.bounds == [greedy, older]
    assert bindings.live == 1
    assert bindings.take(Path("/w/c")) is newer


async def test_a_process_is_released_once_its_time_is_up_unless_taken_first() -> None:
    bindings, released = _bindings(seconds=0.05)
    idle, taken = _bound(), _bound()
    assert bindings.keep(Path("/w/a"), idle, capacity=CAPACITY)
    assert bindings.keep(Path("/w/b"), taken, capacity=CAPACITY)
    assert bindings.take(Path("/w/b")) is taken  # its next block came: its timer is off
    await asyncio.sleep(0.2)
    assert released.bounds == [idle]
    assert len(bindings) == 0


async def test_a_conversation_bound_again_lets_its_earlier_process_go() -> None:
    """Another replica ran a block in between, or the block ran in a fresh fork: the process the
    conversation left earlier has a namespace of the past."""
    bindings, released = _bindings(seconds=0.05)
    earlier, later = _bound(), _bound()
    assert bindings.keep(Path("/w/a"), earlier, capacity=CAPACITY)
    assert bindings.keep(Path("/w/a"), later, capacity=CAPACITY)
    assert released.bounds == [earlier]
    await asyncio.sleep(0.2)  # the earlier one's timer does not release it again
    assert released.bounds == [earlier, later]


async def test_nothing_is_kept_or_released_after_close() -> None:
    bindings, released = _bindings(seconds=0.05)
    kept = _bound()
    assert bindings.keep(Path("/w/a"), kept, capacity=CAPACITY)
    bindings.close()  # its worker is killed with the pool's others: not released one by one
    await asyncio.sleep(0.2)
    assert released.bounds == []
    late = _bound()
    assert not bindings.keep(Path("/w/b"), late, capacity=CAPACITY)
    assert released.bounds == [late]
    assert not bindings.give_way()


async def test_each_tier_holds_its_own_capacity_and_gives_way_within_it() -> None:
    """Plain and preloaded workers are two supervisors: binding a process of one tier never
    releases a process of the other (that would free no worker of the tier that is short)."""
    bindings, released = _bindings()
    plain = [_bound(tier="plain") for _ in range(3)]
    preloaded = [_bound(tier="preloaded") for _ in range(2)]
    assert bindings.keep(Path("/w/p0"), plain[0], capacity=CAPACITY)
    assert bindings.keep(Path("/w/d0"), preloaded[0], capacity=CAPACITY)
    assert bindings.keep(Path("/w/d1"), preloaded[1], capacity=CAPACITY)
    assert bindings.keep(Path("/w/p1"), plain[1], capacity=CAPACITY)
    assert released.bounds == []  # four bound, two of each tier
    assert bindings.keep(Path("/w/p2"), plain[2], capacity=CAPACITY)
    assert released.bounds == [plain[0]]  # the oldest plain one, though preloaded[0] is older still
    assert bindings.give_way("preloaded")
    assert released.bounds == [plain[0], preloaded[0]]
    assert bindings.give_way("preloaded")
    assert not bindings.give_way("preloaded")  # none of that tier is left
    assert bindings.give_way()  # either tier: the plain ones are left
    assert released.bounds[-1] is plain[1]
