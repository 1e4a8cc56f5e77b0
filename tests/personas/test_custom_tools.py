"""A persona's custom tools in a conversation, over HTTP with the scripted LLM: Python tools run
inside the sandbox (journaled across a pause), external ones pause the turn, and the request's
tools win a name clash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from app.llm.scripted import ScriptedLLM
from tests.conftest import AppFactory

PERSONA = """\
name: shop
description: A shop assistant with a price list.
identity: You help customers of the shop.
custom_tools:
  - name: get_price
    description: The price of an item, in euros.
    execution_mode: internal
    implementation: tools/prices.py::get_price
    parameters:
      type: object
      properties:
        sku: {type: string, description: The item's code.}
        quantity: {type: integer}
      required: [sku]
    returns: {type: dict, description: "{'sku': str, 'total': float}"}
  - name: place_order
    description: Place an order for the customer (run by the shop's own system).
    execution_mode: external
    parameters:
      type: object
      properties:
        sku: {type: string}
        quantity: {type: integer}
      required: [sku, quantity]
"""

PRICES = """\
PRICES = {"tea": 4.5, "cup": 12.0}


def get_price(sku, quantity=1):
    with open("prices.log", "a") as log:  # in the conversation's working directory
        log.write(f"{sku} x{quantity}\\n")
    if sku not in PRICES:
        raise KeyError(f"no item {sku!r}; the shop sells {', '.join(sorted(PRICES))}")
    return {"sku": sku, "total": PRICES[sku] * quantity}
"""


def block(code: str) -> str:
    return f"<helpers>\n{code}\n</helpers>"


def shop_personas(root: Path, prices: str = PRICES) -> Path:
    personas = root / "personas"
    (personas / "tools").mkdir(parents=True, exist_ok=True)
    (personas / "shop.yaml").write_text(PERSONA, encoding="utf-8")
    (personas / "tools" / "prices.py").write_text(prices, encoding="utf-8")
    return personas


async def create(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/conversations", json={"input": "hi", "persona": "shop", **body})
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


async def test_python_tool_runs_in_the_sandbox(
    make_client: AppFactory, llm: ScriptedLLM, tmp_path: Path
) -> None:
    llm.script(
        block(
            "quote = get_price('tea', quantity=2)\nprint(quote['total'])\ntry:\n    get_price('cake')\n"
            "except KeyError as exc:\n    print('missing:', exc)"
        ),
        "Two teas cost 9 euros.",
    )
    async with make_client(personas_dir=shop_personas(tmp_path)) as client:
        turn = await create(client)
        persona = (await client.get("/v1/personas/shop")).json()
    assert turn["status"] == "completed", turn
    assert turn["output"] == "Two teas cost 9 euros."
    result = llm.requests[1].all_text
    assert "9.0\nmissing: \"no item 'cake'; the shop sells cup, tea\"" in result
    # Documented from the YAML, in the persona's prompt.
    assert "get_price(*, sku: str, quantity: int | None = None) -> dict" in llm.requests[0].instructions
    assert [(t["name"], t["execution_mode"], t["implementation"]) for t in persona["custom_tools"]] == [
        ("get_price", "internal", "python"),
        ("place_order", "external", None),
    ]


async def test_python_tool_runs_once_across_a_pause(
    make_client: AppFactory, llm: ScriptedLLM, tmp_path: Path
) -> None:
    """The block prices an item (Python tool), orders it (external: the turn pauses), then reads the
    tool's log: after the resume the block ran again from its start, but the price was replayed
    from the journal, so the tool wrote one line, not two."""
    llm.script(
        block(
            "quote = get_price('cup', 3)\norder = place_order(quote['sku'], 3)\n"
            "print(order, quote['total'])\nprint(open('prices.log').read().strip())"
        ),
        "Ordered.",
    )
    async with make_client(personas_dir=shop_personas(tmp_path)) as client:
        turn = await create(client)
        assert turn["status"] == "awaiting_tool_results", turn
        [call] = turn["pending_tool_calls"]
        assert (call["name"], call["arguments"]) == ("place_order", {"sku": "cup", "quantity": 3})
        done = await client.post(
            f"/v1/conversations/{turn['conversation_id']}/tool-results",
            json={"results": [{"tool_call_id": call["id"], "output": "order-7"}]},
        )
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "completed"
    assert "<helpers_result>\norder-7 36.0\ncup x3\n</helpers_result>" in llm.requests[1].all_text


async def test_request_tool_replaces_a_persona_tool_and_says_so(
    make_client: AppFactory, llm: ScriptedLLM, tmp_path: Path
) -> None:
    llm.script(block("print(get_price('tea'))"), "ok")
    tool = {
        "type": "function",
        "name": "get_price",
        "description": "Prices from the caller's catalogue.",
        "parameters": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]},
    }
    async with make_client(personas_dir=shop_personas(tmp_path)) as client:
        turn = await create(client, tools=[tool])
    assert turn["status"] == "awaiting_tool_results"
    assert turn["pending_tool_calls"][0]["arguments"] == {"sku": "tea"}
    assert turn["warnings"] == ["tool 'get_price' from the request replaces the persona's tool of that name"]


async def test_an_edited_tool_file_takes_effect_on_the_next_turn(
    make_client: AppFactory, llm: ScriptedLLM, tmp_path: Path
) -> None:
    personas = shop_personas(tmp_path)
    tea = block("print(get_price('tea'))")
    llm.script(tea, "first", tea, "second", tea, "third")
    async with make_client(personas_dir=personas) as client:
        turn = await create(client)
        (personas / "tools" / "prices.py").write_text(PRICES.replace("4.5", "5.0") + "\n# v2\n")
        again = await client.post(
            f"/v1/conversations/{turn['conversation_id']}/messages", json={"input": "again"}
        )
        assert again.status_code == 200, again.text
        (personas / "tools" / "prices.py").unlink()
        gone = await client.post(
            f"/v1/conversations/{turn['conversation_id']}/messages", json={"input": "more"}
        )
    assert "'total': 4.5" in llm.requests[1].all_text
    assert "'total': 5.0" in llm.requests[3].all_text
    # A file that disappeared: the tool raises where it is called, saying why; the turn goes on.
    assert gone.status_code == 200
    assert "RuntimeError: the implementation of get_price cannot be read" in llm.requests[5].all_text
