"""Every example of every shipped persona runs: each `<helpers>` block is executed, in order, in one
namespace per example, against stubs of every helper and every custom tool. A stub checks its
arguments against the documented signature (helpers) or the JSON Schema (custom tools, keyword-only)
and returns a plausible value, so an undefined name, a syntax error or a wrong call fails here."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib
import pytest
from jsonschema import Draft202012Validator

from app.helpers import HELPERS
from app.personas.loader import PENDING_HELPERS, helpers_blocks, load_personas
from app.personas.models import CustomTool, Persona

matplotlib.use("Agg")

PERSONAS = load_personas()

# Documented signatures of the helper library that is not registered yet (issue 4); a registered
# helper's own signature always wins.
PENDING_SIGNATURES = {
    "llm_bind": "llm_bind(data, signature)",
    "llm_list_bind": "llm_list_bind(data, instructions, count=None)",
    "coerce": "coerce(data, type)",
    "pandas_bind": "pandas_bind(data)",
    "sabre_call": "sabre_call(description, expr_list=None)",
    "download": "download(urls)",
    "FS.read_file": "FS.read_file(path)",
    "FS.write_file": "FS.write_file(path, content)",
    "FS.list_files": "FS.list_files(directory='.', pattern='*')",
    "Bash.execute": "Bash.execute(command)",
    "Search.search": "Search.search(query, num_results=10)",
    "Web.get": "Web.get(url)",
    "Web.download_csv": "Web.download_csv(url)",
    "Browser.screenshot": "Browser.screenshot(url)",
}
# Every pending helper has a stub signature here; once registered, its own signature is used.
assert set(PENDING_HELPERS) <= set(PENDING_SIGNATURES)

CSV = "month,revenue,category,value\nJan,100,a,1\nFeb,120,b,2\nMar,90,a,3\n"


class SmartFrame:
    """What ``pandas_bind`` returns: the frame, plus ``.ask``."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def ask(self, question: str) -> str:
        assert isinstance(question, str)
        return "Revenue peaks in February."


def _search(query: str, num_results: int = 10) -> list[dict[str, str]]:
    assert isinstance(query, str)
    assert query
    return [
        {"title": f"Result {i}", "url": f"https://example.com/{i}", "snippet": f"About {query}"}
        for i in range(num_results)
    ]


def _download(urls: Any) -> list[dict[str, Any]]:
    items = urls if isinstance(urls, list) else [urls]
    return [
        {"url": u["url"] if isinstance(u, dict) else u, "content_type": "text/html", "text": f"Page text {i}"}
        for i, u in enumerate(items)
    ]


def _download_csv(url: str) -> str:
    path = Path("downloaded.csv")
    path.write_text(CSV)
    return str(path)


def _parallel(tool: Any, items: Any = None, *, return_exceptions: bool = False) -> list[Any]:
    """``parallel`` as the runtime runs it (one call after another here): both forms, dict items
    as keyword arguments."""
    if items is None:
        assert isinstance(tool, list | tuple), "parallel([(tool, {kwargs}), ...])"
        calls = [(fn, kwargs) for fn, kwargs in tool]
    else:
        assert callable(tool)
        calls = [(tool, item) for item in items]
    results = []
    for fn, arguments in calls:
        assert callable(fn)
        results.append(fn(**arguments) if isinstance(arguments, dict) else fn(arguments))
    return results


HELPER_RETURNS: dict[str, Callable[..., Any]] = {
    "parallel": _parallel,
    "llm_call": lambda expr_list, instructions: "First finding\nSecond finding",
    "result": lambda value: None,
    "helpers": lambda term=None: "llm_call(expr_list, instructions): Ask the model.",
    "llm_bind": lambda data, signature: {"value": 1},
    "llm_list_bind": lambda data, instructions, count=None: ["one", "two"],
    "coerce": lambda data, type: data,
    "pandas_bind": SmartFrame,
    "sabre_call": lambda description, expr_list=None: "sub-task answer",
    "download": _download,
    "FS.read_file": lambda path: "def add(a, b):\n    return a - b\n",
    "FS.write_file": lambda path, content: None,
    "FS.list_files": lambda directory=".", pattern="*": ["script.py", "legacy_module.py"],
    "Bash.execute": lambda command: "3 passed in 0.02s",
    "Search.search": _search,
    "Web.get": lambda url, **kw: "# Hello\n\nThe page's readable text.",
    "Web.download_csv": _download_csv,
    "Browser.screenshot": lambda url, **kw: "screenshot-example.com.png",
}


def _checked(signature: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` behind the documented ``signature``: a call that does not bind raises TypeError."""
    params = signature[signature.index("(") :]
    tree = ast.parse(f"def _{params}: pass")
    func = tree.body[0]
    assert isinstance(func, ast.FunctionDef)
    func.returns = None
    for arg in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]:
        arg.annotation = None
    namespace: dict[str, Any] = {}
    exec(compile(tree, "<signature>", "exec"), namespace)
    bound_signature = inspect.signature(namespace["_"])

    def stub(*args: Any, **kwargs: Any) -> Any:
        bound_signature.bind(*args, **kwargs)
        return fn(*args, **kwargs)

    return stub


def helper_namespace() -> dict[str, Any]:
    """A stub for every helper, registered or pending; dotted names become attributes."""
    pending = {name: sig for name, sig in PENDING_SIGNATURES.items() if name in PENDING_HELPERS}
    signatures = {**pending, **{name: spec.signature for name, spec in HELPERS.items()}}
    namespace: dict[str, Any] = {}
    for name, sig in signatures.items():
        fn = _checked(sig, HELPER_RETURNS.get(name, lambda *a, **k: "stub value"))
        head, _, attr = name.partition(".")
        if attr:
            namespace.setdefault(head, SimpleNamespace())
            setattr(namespace[head], attr, fn)
        else:
            namespace[name] = fn
    return namespace


# -- plausible results of the tau2 tools (shapes of tau2's own data models) ------------------------

ORDER: dict[str, Any] = {
    "order_id": "#W1000231",
    "user_id": "lee_park_5678",
    "address": {
        "address1": "1 Main St",
        "address2": "",
        "city": "Boston",
        "state": "MA",
        "country": "USA",
        "zip": "02110",
    },
    "items": [
        {
            "name": "Water Bottle",
            "product_id": "8310926033",
            "item_id": "3453331371",
            "price": 54.04,
            "options": {"capacity": "500ml"},
        },
        {
            "name": "T-Shirt",
            "product_id": "9523456873",
            "item_id": "8349118980",
            "price": 51.94,
            "options": {"color": "blue", "size": "M"},
        },
    ],
    "status": "delivered",
    "fulfillments": [{"tracking_id": ["123456789012"], "item_ids": ["3453331371", "8349118980"]}],
    "payment_history": [
        {"transaction_type": "payment", "amount": 105.98, "payment_method_id": "credit_card_9513926"}
    ],
}
PRODUCT: dict[str, Any] = {
    "name": "T-Shirt",
    "product_id": "9523456873",
    "variants": {
        "8349118980": {
            "item_id": "8349118980",
            "options": {"color": "blue", "size": "M"},
            "available": True,
            "price": 51.94,
        },
        "2060066974": {
            "item_id": "2060066974",
            "options": {"color": "blue", "size": "L"},
            "available": True,
            "price": 53.57,
        },
        "9612497925": {
            "item_id": "9612497925",
            "options": {"color": "red", "size": "L"},
            "available": False,
            "price": 50.88,
        },
    },
}
RETAIL_USER: dict[str, Any] = {
    "user_id": "sarah_johnson_1234",
    "name": {"first_name": "Sarah", "last_name": "Johnson"},
    "address": ORDER["address"],
    "email": "sarah.johnson@example.com",
    "payment_methods": {
        "credit_card_9513926": {
            "source": "credit_card",
            "id": "credit_card_9513926",
            "brand": "visa",
            "last_four": "4242",
        }
    },
    "orders": ["#W1000231", "#W1000457"],
}
FLIGHT: dict[str, Any] = {
    "flight_number": "HAT152",
    "origin": "JFK",
    "destination": "SEA",
    "status": "available",
    "scheduled_departure_time_est": "08:00:00",
    "scheduled_arrival_time_est": "11:30:00",
    "date": "2024-05-20",
    "available_seats": {"basic_economy": 9, "economy": 12, "business": 4},
    "prices": {"basic_economy": 95, "economy": 180, "business": 420},
}
AIRLINE_USER: dict[str, Any] = {
    "user_id": "ava_kim_1024",
    "name": {"first_name": "Ava", "last_name": "Kim"},
    "address": {
        "address1": "9 Elm St",
        "address2": "",
        "city": "Austin",
        "state": "TX",
        "country": "USA",
        "zip": "78701",
    },
    "email": "ava.kim@example.com",
    "dob": "1990-04-12",
    "payment_methods": {
        "credit_card_4421": {
            "source": "credit_card",
            "id": "credit_card_4421",
            "brand": "visa",
            "last_four": "4421",
        },
        "gift_card_7781": {"source": "gift_card", "id": "gift_card_7781", "amount": 60.0},
    },
    "saved_passengers": [],
    "membership": "gold",
    "reservations": ["R7K2QX"],
}
RESERVATION: dict[str, Any] = {
    "reservation_id": "R7K2QX",
    "user_id": "ava_kim_1024",
    "origin": "JFK",
    "destination": "SEA",
    "flight_type": "one_way",
    "cabin": "economy",
    "flights": [
        {"flight_number": "HAT152", "origin": "JFK", "destination": "SEA", "date": "2024-05-20", "price": 180}
    ],
    "passengers": [{"first_name": "Ava", "last_name": "Kim", "dob": "1990-04-12"}],
    "payment_history": [{"payment_id": "credit_card_4421", "amount": 180}],
    "created_at": "2024-05-14T09:12:00",
    "total_baggages": 1,
    "nonfree_baggages": 0,
    "insurance": "no",
    "status": None,
}

TOOL_RETURNS: dict[str, Callable[..., Any]] = {
    "find_user_id_by_name_zip": lambda **kw: "sarah_johnson_1234",
    "find_user_id_by_email": lambda **kw: "lee_park_5678",
    "get_order_details": lambda order_id: {**ORDER, "order_id": order_id},
    "get_product_details": lambda product_id: PRODUCT,
    "get_item_details": lambda item_id: PRODUCT["variants"]["8349118980"],
    "list_all_product_types": lambda: {"T-Shirt": "9523456873", "Water Bottle": "8310926033"},
    "return_delivered_order_items": lambda **kw: {
        **ORDER,
        "status": "return requested",
        "return_items": sorted(kw["item_ids"]),
    },
    "modify_pending_order_items": lambda **kw: {**ORDER, "status": "pending (item modified)"},
    "get_reservation_details": lambda reservation_id: {**RESERVATION, "reservation_id": reservation_id},
    "search_direct_flight": lambda **kw: [
        FLIGHT,
        {**FLIGHT, "flight_number": "HAT290", "prices": {**FLIGHT["prices"], "economy": 150}},
    ],
    "search_onestop_flight": lambda **kw: [[FLIGHT, {**FLIGHT, "flight_number": "HAT300"}]],
    "book_reservation": lambda **kw: {
        **RESERVATION,
        "reservation_id": "N3WRES",
        "payment_history": kw["payment_methods"],
    },
    "update_reservation_baggages": lambda **kw: {
        **RESERVATION,
        **{k: v for k, v in kw.items() if k != "payment_id"},
    },
    "cancel_reservation": lambda reservation_id: {**RESERVATION, "status": "cancelled"},
    "calculate": lambda expression: "42.0",
    "transfer_to_human_agents": lambda summary: "Transfer successful",
}


def _user_details(user_id: str, *, persona: str) -> dict[str, Any]:
    return {**(AIRLINE_USER if persona == "tau2-airline" else RETAIL_USER), "user_id": user_id}


def tool_stub(tool: CustomTool, *, persona: str) -> Callable[..., Any]:
    """A custom tool as the runtime exposes it: keyword arguments checked against its JSON Schema."""
    validator = Draft202012Validator(tool.parameters)
    declared = set(tool.parameters.get("properties", {}))

    def stub(*args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(f"{tool.name}() takes keyword arguments only")
        unknown = set(kwargs) - declared
        if unknown:
            raise TypeError(f"{tool.name}() got unexpected arguments {sorted(unknown)}")
        errors = [e.message for e in validator.iter_errors(kwargs)]
        if errors:
            raise TypeError(f"{tool.name}(): {'; '.join(errors)}")
        if tool.name == "get_user_details":
            return _user_details(kwargs["user_id"], persona=persona)
        fn = TOOL_RETURNS.get(tool.name)
        if fn is not None:
            return fn(**kwargs)
        kind = tool.returns.type if tool.returns else "Any"
        return {} if kind == "dict" else [] if kind.startswith("list") else "ok"

    return stub


def examples() -> Iterator[Any]:
    for name, persona in sorted(PERSONAS.items()):
        for index, _ in enumerate(persona.examples):
            yield pytest.param(persona, index, id=f"{name}-example{index + 1}")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The files the data-analyst examples read, in a scratch working directory."""
    for name in ("sales_data.csv", "2023_data.csv", "2024_data.csv", "data.csv"):
        (tmp_path / name).write_text(CSV)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("persona", "index"), list(examples()))
def test_example_runs_against_stubs(persona: Persona, index: int, workdir: Path) -> None:
    import matplotlib.pyplot as plt

    namespace = helper_namespace()
    for tool in persona.custom_tools:
        namespace[tool.name] = tool_stub(tool, persona=persona.name)
    blocks = list(helpers_blocks(persona.examples[index]))
    assert blocks, "an example should show at least one <helpers> block"
    try:
        for number, (_, code) in enumerate(blocks, 1):
            assert code is not None
            exec(compile(code, f"<{persona.name} example {index + 1} block {number}>", "exec"), namespace)
    finally:
        plt.close("all")


def test_every_shipped_persona_has_examples_that_are_tested() -> None:
    for name in ("web-researcher", "coder", "data-analyst", "tau2-retail", "tau2-airline"):
        assert len(PERSONAS[name].examples) >= 2, name


def test_tau2_personas_declare_the_real_tool_names_as_external() -> None:
    retail = {
        "find_user_id_by_name_zip",
        "find_user_id_by_email",
        "get_user_details",
        "get_order_details",
        "get_product_details",
        "cancel_pending_order",
        "return_delivered_order_items",
        "exchange_delivered_order_items",
        "modify_pending_order_items",
        "modify_pending_order_address",
        "modify_user_address",
        "transfer_to_human_agents",
    }
    airline = {
        "get_user_details",
        "get_reservation_details",
        "search_direct_flight",
        "search_onestop_flight",
        "book_reservation",
        "cancel_reservation",
        "update_reservation_flights",
        "update_reservation_baggages",
        "update_reservation_passengers",
        "send_certificate",
        "calculate",
        "transfer_to_human_agents",
    }
    for name, expected in (("tau2-retail", retail), ("tau2-airline", airline)):
        tools = {t.name: t for t in PERSONAS[name].custom_tools}
        assert expected <= set(tools), expected - set(tools)
        assert {t.execution_mode for t in tools.values()} == {"external"}
        assert all(t.parameters.get("additionalProperties") is False for t in tools.values())


def test_a_wrong_call_is_caught_by_the_stubs(workdir: Path) -> None:
    """The harness itself: arity and schema mistakes fail, so a green run means something."""
    retail = PERSONAS["tau2-retail"]
    namespace = helper_namespace()
    for tool in retail.custom_tools:
        namespace[tool.name] = tool_stub(tool, persona=retail.name)
    for code, error in [
        ('get_order_details("#W1")', "keyword arguments only"),
        ('get_order_details(order="#W1")', "unexpected arguments ['order']"),
        ("find_user_id_by_name_zip(first_name='A', last_name='B')", "'zip' is a required property"),
        ("cancel_pending_order(order_id='#W1', reason='changed my mind')", "is not one of"),
        ("llm_call('only one argument')", "missing a required argument"),
        ("FS.read_file('a', 'b')", "too many positional arguments"),
        ("undefined_tool()", "name 'undefined_tool' is not defined"),
    ]:
        with pytest.raises((TypeError, NameError), match=re.escape(error)):
            exec(code, dict(namespace))
