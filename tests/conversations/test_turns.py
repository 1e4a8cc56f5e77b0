"""End to end over HTTP: the turn loop with the scripted LLM and the real sandbox, on both stores."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from app.llm.scripted import Reply, ScriptedLLM
from tests.conftest import AppFactory


def block(code: str) -> str:
    return f"Let me work it out.\n<helpers>\n{code}\n</helpers>"


async def create(client: httpx.AsyncClient, text: str = "hi", **body: object) -> httpx.Response:
    return await client.post("/v1/conversations", json={"input": text, **body})


async def test_block_computes_and_prints(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script(block("x = 6 * 7\nprint('x is', x)\nresult(x + 1)"), "The answer is 42.</complete>")
    response = await create(client, "What is 6*7?")
    assert response.status_code == 201, response.text
    turn = response.json()
    assert turn["status"] == "completed"
    assert turn["output"] == "The answer is 42."
    assert turn["pending_tool_calls"] == []
    assert turn["error"] is None
    assert turn["usage"]["llm_calls"] == 2
    assert turn["usage"]["iterations"] == 2
    assert turn["usage"]["input_tokens"] > 0
    assert turn["version"] == 1
    # The model saw the block's output, and the system prompt came from the persona.
    second = llm.requests[1]
    assert "<helpers_result>\nx is 42\n43\n</helpers_result>" in second.all_text
    assert "You are a helpful AI assistant" in llm.requests[0].instructions
    assert llm.requests[0].model == "scripted-model"

    messages = (await client.get(f"/v1/conversations/{turn['conversation_id']}/messages")).json()
    kinds = [[p["kind"] for p in m["parts"]] for m in messages["data"]]
    assert kinds == [["text"], ["text", "helpers"], ["helpers_result"], ["text"]]
    assert [m["role"] for m in messages["data"]] == ["user", "assistant", "user", "assistant"]
    assert messages["data"][1]["parts"][1]["code"] == "x = 6 * 7\nprint('x is', x)\nresult(x + 1)"
    assert messages["has_more"] is False

    state = (await client.get(f"/v1/conversations/{turn['conversation_id']}")).json()
    assert state["status"] == "idle"
    assert state["version"] == 1
    assert state["usage"]["llm_calls"] == 2
    assert state["persona"] == "default"


async def test_variables_survive_a_new_app_process(make_client: AppFactory, llm: ScriptedLLM) -> None:
    llm.script(block("import math\nsecret = {'n': 41}\nroot = math.sqrt(16)"), "Stored.")
    # The first app starts its sandbox workers with it (the service's default; the suite's apps are
    # lazy), the second at its first block.
    async with make_client(runtime_lazy_start=False) as first:
        assert first.app.state.pool.idle_workers == 1  # type: ignore[attr-defined]
        turn = (await create(first, "remember")).json()
    assert turn["status"] == "completed", turn
    # A new app (new pool, new engine) on the same store continues the conversation.
    llm.script(block("print(secret['n'] + 1, root, math.pi > 3)"), "Done.")
    async with make_client() as second:
        response = await second.post(
            f"/v1/conversations/{turn['conversation_id']}/messages", json={"input": "and now?"}
        )
    assert response.status_code == 200, response.text
    assert response.json()["version"] == 2
    assert "<helpers_result>\n42 4.0 True\n</helpers_result>" in llm.requests[-1].all_text
    # The whole transcript went to the model on the second turn.
    assert "remember" in llm.requests[-2].all_text


async def test_exception_is_shown_with_line_number_and_fixed(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script(
        block("a = 10\nb = 0\nc = a / b"),
        block("c = a / 2\nprint(c)"),
        "c is 5.0</complete>",
    )
    turn = (await create(client, "divide")).json()
    assert turn["status"] == "completed", turn
    error_result = llm.requests[1].all_text
    assert "ZeroDivisionError" in error_result
    assert "line 3" in error_result
    assert "c = a / b" in error_result
    assert "Traceback" in error_result
    assert "app/runtime" not in error_result
    # `a` was assigned before the error and survived into the fixing block.
    assert "<helpers_result>\n5.0\n</helpers_result>" in llm.requests[2].all_text


async def test_max_iterations_fails_the_turn_and_conversation_goes_on(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script(block("print(1)"), block("print(2)"))
    response = await create(client, "loop", max_iterations=2)
    turn = response.json()
    assert turn["status"] == "failed"
    assert turn["error"]["code"] == "max_iterations_reached"
    assert turn["usage"]["iterations"] == 2
    assert len(llm.requests) == 2
    llm.script("Fine, here is the answer.")
    again = await client.post(
        f"/v1/conversations/{turn['conversation_id']}/messages", json={"input": "just answer"}
    )
    assert again.json()["status"] == "completed"
    assert again.json()["output"] == "Fine, here is the answer."


async def test_infinite_loop_hits_wall_clock_and_server_stays_healthy(
    make_client: AppFactory, llm: ScriptedLLM
) -> None:
    llm.script(block("n = 1\nwhile True:\n    pass"), block("print(n)"), "ok")
    async with make_client(block_wall_clock_seconds=1.0, block_cpu_seconds=5) as client:
        turn = (await create(client, "spin")).json()
        assert turn["status"] == "completed", turn
        assert "limit: wall_clock" in llm.requests[1].all_text
        # The block was killed, so the variables are those from before it: `n` is unknown.
        assert "NameError" in llm.requests[2].all_text
        assert (await client.get("/healthz")).status_code == 200
        llm.script(block("print('alive')"), "ok")
        await create(client, "again")
        assert "<helpers_result>\nalive\n</helpers_result>" in llm.requests[-1].all_text


async def test_memory_bomb_is_stopped(make_client: AppFactory, llm: ScriptedLLM) -> None:
    llm.script(block("x = bytearray(3 * 1024**3)"), "ok")
    async with make_client(block_memory_mb=512) as client:
        turn = (await create(client, "eat memory")).json()
    assert turn["status"] == "completed"
    shown = llm.requests[1].all_text
    assert "MemoryError" in shown or "limit: memory" in shown


async def test_llm_call_runs_through_the_parent(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script(
        block("up = llm_call(['hello world'], 'Uppercase it')\nprint(up)"),
        "HELLO WORLD",
        "Done.",
    )
    turn = (await create(client, "shout")).json()
    assert turn["status"] == "completed", turn
    assert turn["usage"]["llm_calls"] == 3
    assert "hello world" in llm.requests[1].all_text
    assert "Uppercase it" in llm.requests[1].all_text
    assert "<helpers_result>\nHELLO WORLD\n</helpers_result>" in llm.requests[2].all_text


async def test_unpicklable_values_are_dropped_and_named(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script(
        block("import threading\nlock = threading.Lock()\nkeep = [1, 2]"),
        block("print(keep)"),
        "ok",
    )
    turn = (await create(client, "lock")).json()
    assert turn["status"] == "completed"
    assert "dropped: lock" in llm.requests[1].all_text
    assert "[1, 2]" in llm.requests[2].all_text


async def test_sandbox_sees_no_server_secrets(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    code = (
        "import os\n"
        "print(sorted(k for k in os.environ if any(s in k for s in ('KEY', 'SABRE', 'DATABASE', 'REDIS'))))"
    )
    llm.script(block(code), "ok")
    turn = (await create(client, "env")).json()
    assert turn["status"] == "completed"
    shown = llm.requests[1].all_text
    assert "<helpers_result>\n[]\n" in shown
    assert "sk-test-secret-key" not in shown


async def test_llm_down_fails_the_turn_readably_and_conversation_goes_on(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    llm.script(Reply(status=503), Reply(status=503))
    turn = (await create(client, "hello")).json()
    assert turn["status"] == "failed"
    assert turn["error"]["code"] == "llm_unavailable"
    assert turn["error"]["retryable"] is True
    assert "Traceback" not in turn["error"]["message"]
    llm.script("Back online.")
    again = await client.post(
        f"/v1/conversations/{turn['conversation_id']}/messages", json={"input": "retry"}
    )
    assert again.json()["status"] == "completed"
    assert again.json()["version"] == 2
    # The failed turn's user message is in the transcript the model gets.
    assert "hello" in llm.requests[-1].all_text


async def test_llm_garbage_fails_the_turn(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script(Reply(garbage=True), Reply(garbage=True))
    turn = (await create(client, "hello")).json()
    assert turn["status"] == "failed"
    assert turn["error"]["code"] == "llm_bad_response"


async def test_llm_unreachable(make_client: AppFactory) -> None:
    async with make_client(openai_base_url="http://127.0.0.1:9/v1") as client:
        turn = (await create(client, "hello")).json()
    assert turn["status"] == "failed"
    assert turn["error"]["code"] == "llm_unavailable"


async def test_second_message_while_a_turn_runs_is_409(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    llm.script("first")
    conv = (await create(client, "start")).json()["conversation_id"]
    llm.script(Reply(text="slow answer", delay=1.0), "never used")
    url = f"/v1/conversations/{conv}/messages"
    slow = asyncio.create_task(client.post(url, json={"input": "slow"}))
    await asyncio.sleep(0.4)
    busy = await client.post(url, json={"input": "impatient"})
    assert busy.status_code == 409
    problem = busy.json()
    assert busy.headers["content-type"].startswith("application/problem+json")
    assert problem["code"] == "turn_in_progress"
    running = problem["current"]["turn_id"]
    assert running.startswith("turn_")
    assert running in problem["detail"]
    state = (await client.get(f"/v1/conversations/{conv}")).json()
    assert state["status"] == "running"
    done = await slow
    assert done.status_code == 200
    assert done.json()["turn_id"] == running
    assert (await client.get(f"/v1/conversations/{conv}")).json()["status"] == "idle"


async def test_persona_limits_override_the_service_limits(
    make_client: AppFactory, llm: ScriptedLLM, tmp_path: Path
) -> None:
    personas = tmp_path / "personas"
    personas.mkdir()
    (personas / "impatient.yaml").write_text(
        "name: impatient\ndescription: Short fuse.\nidentity: You are quick.\n"
        "limits:\n  wall_clock_seconds: 1\n",
        encoding="utf-8",
    )
    llm.script(block("while True:\n    pass"), "ok")
    async with make_client(
        personas_dir=personas, block_wall_clock_seconds=20, block_cpu_seconds=20
    ) as client:
        turn = (await create(client, "spin", persona="impatient")).json()
    assert turn["status"] == "completed", turn
    assert "limit: wall_clock 1" in llm.requests[1].all_text
    assert "You are quick." in llm.requests[0].instructions


async def test_metrics_count_turns_and_blocks(client: httpx.AsyncClient, llm: ScriptedLLM) -> None:
    def value(text: str, name: str) -> float:
        lines = [line for line in text.splitlines() if line.startswith(name + " ")]
        return float(lines[0].split()[-1]) if lines else 0.0

    before = (await client.get("/metrics")).text
    llm.script(block("print(1)"), "done")
    await create(client, "count me")
    after = (await client.get("/metrics")).text
    completed = 'sabre_turns_total{model="scripted-model",outcome="completed",persona="default"}'
    ok_blocks = 'sabre_blocks_total{outcome="ok"}'
    fresh = 'sabre_block_processes_total{process="fresh"}'
    assert value(after, completed) == value(before, completed) + 1
    assert value(after, ok_blocks) == value(before, ok_blocks) + 1
    assert value(after, fresh) == value(before, fresh) + 1  # a new conversation's block: a new fork


async def test_sabre_call_runs_a_sub_conversation(make_client: AppFactory, llm: ScriptedLLM) -> None:
    llm.script(
        block("answer = sabre_call('Add the numbers', [2, 3])\nprint('sub said:', answer)"),
        block("print(sum([2, 3]))"),  # the sub-task's own block, in its own namespace
        "5",  # the sub-task's answer
        "The sum is 5.",
    )
    async with make_client(runtime_workers=2) as client:
        turn = (await create(client, "delegate")).json()
    assert turn["status"] == "completed", turn
    assert turn["usage"]["llm_calls"] == 4
    # The sub-task started from a fresh conversation: only its description and data.
    sub_first = llm.requests[1]
    assert "Add the numbers" in sub_first.all_text
    assert "delegate" not in sub_first.last_user_text
    assert "<helpers_result>\nsub said: 5\n</helpers_result>" in llm.requests[3].all_text


async def test_persona_file_size_limit(make_client: AppFactory, llm: ScriptedLLM, tmp_path: Path) -> None:
    personas = tmp_path / "personas"
    personas.mkdir()
    (personas / "small.yaml").write_text(
        "name: small\ndescription: Small files.\nidentity: You write little.\nlimits:\n  file_size_mb: 1\n",
        encoding="utf-8",
    )
    llm.script(block("with open('big.bin', 'wb') as f:\n    f.write(b'x' * 5_000_000)"), "ok")
    async with make_client(personas_dir=personas) as client:
        turn = (await create(client, "write", persona="small")).json()
    assert turn["status"] == "completed", turn
    assert "limit: file_size 1MB" in llm.requests[1].all_text


async def test_nul_characters_from_the_model_and_the_block_are_stored(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    """A request may not carry a NUL character, but a model's text and a block's output may: the
    turn is stored on both stores (a 500 on PostgreSQL before, which keeps no NUL in text). A
    block's NUL stays one (JSON columns keep it escaped); a model's becomes U+FFFD, as the turn's
    output is text."""
    llm.script(block("print('a\\x00b')\nresult('c\\x00d')"), "done \x00 here</complete>")
    response = await create(client, "print a NUL")
    assert response.status_code == 201, response.text
    turn = response.json()
    assert turn["status"] == "completed", turn
    assert turn["output"] == "done \ufffd here"
    assert "<helpers_result>\na\x00b\nc\x00d\n</helpers_result>" in llm.requests[1].all_text
    messages = (await client.get(f"/v1/conversations/{turn['conversation_id']}/messages")).json()
    assert messages["data"][2]["parts"][0]["text"] == "a\x00b\nc\x00d"
    assert messages["data"][3]["parts"][0]["text"] == "done \ufffd here</complete>"
    # The turn's events keep it too (on PostgreSQL their JSON goes in as text, cast per row).
    events = (await client.get(f"/v1/conversations/{turn['conversation_id']}/events")).json()["data"]
    completed = [event["data"] for event in events if event["type"] == "block.completed"]
    assert completed == [{"status": "ok", "text": "a\x00b\nc\x00d", "files": []}], completed
    # The next turn reads that history back, and ends on the existing conversation's path.
    llm.script(block("print('e\\x00f')"), "ok \x00</complete>")
    follow_up = await client.post(
        f"/v1/conversations/{turn['conversation_id']}/messages", json={"input": "and?"}
    )
    assert follow_up.status_code == 200, follow_up.text
    assert follow_up.json()["output"] == "ok \ufffd"
    assert "a\x00b" in llm.requests[2].all_text
    messages = (await client.get(f"/v1/conversations/{turn['conversation_id']}/messages")).json()
    assert messages["data"][6]["parts"][0]["text"] == "e\x00f"


async def test_lone_surrogates_from_a_block_do_not_wedge_the_conversation(
    client: httpx.AsyncClient, llm: ScriptedLLM
) -> None:
    """A block may send a lone surrogate (a \\udXXX escape that JSON decodes on its own) in a
    result, an error or a dict key. No UTF-8 encoder takes one: before, the model's next request
    carrying the transcript failed (reported as llm_bad_response), the turn and every later one
    with it, and reading the messages was a 500. It becomes U+FFFD, as a model's NUL does."""
    code = "result('c\\ud800d')\nresult({'k\\udc00': ['e\\udfff']})\nraise ValueError('f\\udbff')"
    llm.script(block(code), "done</complete>")
    response = await create(client, "surrogates")
    assert response.status_code == 201, response.text
    turn = response.json()
    assert turn["status"] == "completed", turn
    assert (
        'c\ufffdd\n{"k\ufffd": ["e\ufffd"]}\nTraceback (line 3): ValueError: f\ufffd'
        in llm.requests[1].all_text
    )
    messages = await client.get(f"/v1/conversations/{turn['conversation_id']}/messages")
    assert messages.status_code == 200, messages.text
    llm.script("ok</complete>")
    follow_up = await client.post(
        f"/v1/conversations/{turn['conversation_id']}/messages", json={"input": "and?"}
    )
    assert follow_up.status_code == 200, follow_up.text
    assert follow_up.json()["status"] == "completed", follow_up.text
