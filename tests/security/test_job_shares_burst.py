"""A tenant that queues its jobs all at once still takes its fair share, no more
(app.kit.jobs.defer): each job is placed after the tenant's jobs queued before it, even those
queued at the same moment by other requests or other processes. Both stores, real workers."""

from __future__ import annotations

import asyncio

from tests.conftest import AppFactory
from tests.events.test_webhook_shares import HeldReceiver, _priorities, _schedule, held
from tests.kit.test_jobs import eventually

__all__ = ["held"]  # the fixture, used by name


async def test_a_burst_of_deferrals_is_ranked_one_by_one(make_client: AppFactory, held: HeldReceiver) -> None:
    """One webhook slot, held by globex's first delivery; acme queues four deliveries at once, then
    globex a second. Acme's four take priorities 0 to -3, so globex's second (-1) goes third;
    before, the four were placed concurrently and all took 0, the whole burst ahead of globex."""
    async with make_client(webhook_allow="127.0.0.1", webhook_concurrency=1) as client:
        await _schedule(client, tenant="globex", url=f"{held.url}/held/globex", turn_id="turn_g0")
        await eventually(lambda: held.paths == ["/held/globex"], within=10, what="globex's first delivery")
        await asyncio.gather(
            *(
                _schedule(client, tenant="acme", url=f"{held.url}/acme/{index}", turn_id=f"turn_a{index}")
                for index in range(4)
            )
        )
        await _schedule(client, tenant="globex", url=f"{held.url}/globex", turn_id="turn_g1")
        ranks = await _priorities(client, held)
        assert sorted(ranks[f"/acme/{index}"] for index in range(4)) == [-3, -2, -1, 0], ranks
        assert ranks["/globex"] == -1, ranks
        held.release.set()
        await eventually(lambda: len(held.paths) == 6, within=15, what="every delivery arrived")
    assert held.paths[1:4].count("/globex") == 1, held.paths
