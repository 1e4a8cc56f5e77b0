"""A server with preloads keeps plain workers beside them (SABRE_RUNTIME_PLAIN_WORKERS): a turn's
block that names no preloaded module runs without them, and the conversation's next block that
names one runs with them, its variables carried over (the pool's side:
tests/runtime/test_plain_workers.py)."""

from __future__ import annotations

from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory

# ``wave`` is preloaded and named by no block: only a preloaded worker's process holds it.
HOLDS_PRELOADS = "import sys\nprint('preloaded:', 'wa' + 've' in sys.modules)"


async def test_blocks_run_on_the_workers_they_need(make_client: AppFactory, llm: ScriptedLLM) -> None:
    async with make_client(runtime_preload="colorsys,wave", runtime_plain_workers=1) as client:
        llm.script(f"<helpers>\nrows = [1, 2]\n{HOLDS_PRELOADS}\n</helpers>", "first done")
        first = await client.post("/v1/conversations", json={"input": "plain"})
        assert first.json()["status"] == "completed", first.text
        llm.script(
            f"<helpers>\nimport colorsys\nrows.append(3)\nprint(rows)\n{HOLDS_PRELOADS}\n</helpers>",
            "second done",
        )
        second = await client.post(
            f"/v1/conversations/{first.json()['conversation_id']}/messages", json={"input": "preloaded"}
        )
        assert second.json()["status"] == "completed", second.text
    results = [r.last_user_text for r in llm.requests if "<helpers_result>" in r.last_user_text]
    assert len(results) == 2
    assert "preloaded: False" in results[0]
    assert "[1, 2, 3]" in results[1]
    assert "preloaded: True" in results[1]


async def test_a_sub_task_whose_kind_of_worker_is_all_taken_is_refused_not_left_waiting(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    """The parent block holds the only plain worker while it waits on ``sabre_call``: the
    sub-task's own plain block would wait for it for ever (the preloaded worker that is free does
    not serve plain blocks), so the call fails at once, saying why."""
    call = "try:\n    sabre_call('Add', [2, 3])\nexcept Exception as exc:\n    print('refused:', exc)"
    llm.script(f"<helpers>\n{call}\n</helpers>", "done")
    async with make_client(runtime_preload="colorsys", runtime_workers=1, runtime_plain_workers=1) as client:
        turn = (await client.post("/v1/conversations", json={"input": "delegate"})).json()
    assert turn["status"] == "completed", turn
    assert len(llm.requests) == 2  # no sub-task ran
    assert "refused: sabre_call: no sandbox worker is free for the sub-task" in llm.requests[1].last_user_text


async def test_a_sub_task_runs_when_a_worker_of_each_kind_is_free(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    llm.script(
        "<helpers>\nprint('sub said:', sabre_call('Add the numbers', [2, 3]))\n</helpers>",
        "<helpers>\nprint(sum([2, 3]))\n</helpers>",  # the sub-task's block: plain, on the other plain worker
        "5",
        "The sum is 5.",
    )
    async with make_client(runtime_preload="colorsys", runtime_workers=1, runtime_plain_workers=2) as client:
        turn = (await client.post("/v1/conversations", json={"input": "delegate"})).json()
    assert turn["status"] == "completed", turn
    assert "sub said: 5" in llm.requests[3].all_text
