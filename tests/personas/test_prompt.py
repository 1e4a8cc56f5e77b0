"""The prompt builder: layers in order, featured filtering, tool docs, determinism, caching."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.helpers import HELPERS, HelperSpec
from app.personas.loader import SHIPPED_DIR, load_persona_file, load_personas
from app.personas.models import Persona
from app.personas.prompt import FunctionToolDoc, ToolDoc, build_prompt, featured, render_prompt
from app.personas.tooldoc import annotation, signature


def spec(name: str, doc: str) -> HelperSpec:
    return HelperSpec(name=name, signature=f"{name}(x: str) -> str", doc=doc, runs="sandbox")


REGISTRY = {
    "llm_call": spec("llm_call", "Ask the model. " + "Long documentation. " * 40),
    "FS.read_file": spec("FS.read_file", "Read a file. " + "Long documentation. " * 40),
    "Bash.execute": spec("Bash.execute", "Run a command. " + "Long documentation. " * 40),
    "Search.search": spec("Search.search", "Search the web. " + "Long documentation. " * 40),
    "result": spec("result", "Return a value."),
}


def persona(**fields: object) -> Persona:
    return Persona.model_validate({"name": "t", "identity": "You are a test agent.", **fields})


def test_layers_come_in_order() -> None:
    p = persona(
        examples=["<helpers>\nresult(1)\n</helpers>"],
        featured_helpers=["result"],
        custom_tools=[{"name": "lookup", "description": "Look it up.", "execution_mode": "external"}],
    )
    prompt = render_prompt(p, helpers=REGISTRY, instructions="Be brief.")
    order = [
        "You are a test agent.",
        "## System Execution Flow",
        "## Meta Execution Patterns",
        "## Example Workflows",
        "### Example 1",
        "## Featured Helpers",
        "### result(x: str) -> str",
        "## Tools",
        "### lookup() -> Any",
        "## Generic Helper Access",
        "## Instructions for this conversation\n\nBe brief.",
    ]
    positions = [prompt.index(marker) for marker in order]
    assert positions == sorted(positions)
    assert prompt.startswith("You are a test agent.\n\n## System Execution Flow")
    assert prompt.endswith("Be brief.\n")


def test_same_persona_same_bytes() -> None:
    tools = [FunctionToolDoc(name="ext", description="External.", parameters={"type": "object"})]
    first = load_personas()
    second = load_personas()  # fresh objects: nothing cached applies to them
    for name in first:
        a = build_prompt(first[name], instructions="x", tools=tools).encode()
        b = build_prompt(first[name], instructions="x", tools=tools).encode()
        c = build_prompt(second[name], instructions="x", tools=tools).encode()
        assert a == b == c, name


def test_featured_filtering_makes_a_specialist_prompt_smaller() -> None:
    everything = persona(featured_helpers=["*"])
    specialist = persona(featured_helpers=["FS.read_file", "result"])
    full = render_prompt(everything, helpers=REGISTRY)
    small = render_prompt(specialist, helpers=REGISTRY)
    assert len(small) < len(full)
    assert "### FS.read_file(x: str) -> str" in small
    assert "Search the web." not in small
    assert "Run a command." not in small
    # `*` documents every helper, in name order.
    assert [s.name for s in featured(everything, helpers=REGISTRY)] == sorted(REGISTRY)
    # A featured name that is not (yet) a helper is skipped, not rendered as nothing.
    assert [
        s.name for s in featured(persona(featured_helpers=["sabre_call", "result"]), helpers=REGISTRY)
    ] == ["result"]


def test_shipped_specialists_feature_fewer_helpers_than_default() -> None:
    personas = load_personas()
    every = {s.name for s in featured(personas["default"])}
    assert every == set(HELPERS)
    for name in ("web-researcher", "coder", "data-analyst", "tau2-retail", "tau2-airline"):
        assert {s.name for s in featured(personas[name])} <= every


def test_meta_patterns_mention_only_helpers_that_exist() -> None:
    p = persona(featured_helpers=[])
    without = render_prompt(p, helpers={"result": REGISTRY["result"]})
    assert "llm_call(" not in without
    assert "**Text analysis and extraction:**" not in without
    assert "sabre_call" not in without
    assert "**Task delegation:**" not in without
    with_llm = render_prompt(p, helpers=REGISTRY)
    assert "**Text analysis and extraction:**\n* Summarise, extract" in with_llm
    assert "[[" not in with_llm


def test_tools_are_documented_and_the_callers_tool_wins_a_clash() -> None:
    p = persona(
        custom_tools=[
            {
                "name": "get_order",
                "description": "Persona version.",
                "execution_mode": "external",
                "parameters": {
                    "type": "object",
                    "properties": {"order_id": {"type": "string", "description": "Like '#W1'."}},
                    "required": ["order_id"],
                },
                "returns": {"type": "dict", "description": "The order."},
            },
            {"name": "keep_me", "description": "Stays.", "execution_mode": "external"},
        ]
    )
    plain = render_prompt(p, helpers=REGISTRY)
    assert (
        "### get_order(*, order_id: str) -> dict\nPersona version.\nParameters:\n- order_id: Like '#W1'.\n"
        in plain
    )
    assert "Returns: The order." in plain
    caller = FunctionToolDoc(name="get_order", description="Caller version.", parameters={"type": "object"})
    other = FunctionToolDoc(name="refund", description="Refund it.")
    prompt = render_prompt(p, helpers=REGISTRY, tools=[caller, other])
    assert "Persona version." not in prompt
    assert prompt.index("### keep_me() -> Any") < prompt.index("### get_order() -> Any\nCaller version.")
    assert prompt.index("Caller version.") < prompt.index("### refund() -> Any")


def test_any_object_with_name_and_render_is_a_tool_doc() -> None:
    class Doc:
        name = "custom"

        def render(self) -> str:
            return "### custom(*, a: int) -> str\nDoes custom things.\n"

    doc: ToolDoc = Doc()
    prompt = build_prompt(persona(), tools=[doc])
    assert "## Tools" in prompt
    assert "Does custom things." in prompt


def test_no_tools_no_tools_section() -> None:
    assert "## Tools" not in build_prompt(persona())


def test_copies_are_not_served_a_stale_prompt() -> None:
    original = persona(featured_helpers=["result"])
    first = render_prompt(original, helpers=REGISTRY)
    changed = original.model_copy(update={"identity": "You are someone else."})
    assert render_prompt(changed, helpers=REGISTRY).startswith("You are someone else.")
    assert render_prompt(original, helpers=REGISTRY) == first


def test_a_changed_registry_is_not_served_a_stale_prompt() -> None:
    p = persona(featured_helpers=["*"])
    small = render_prompt(p, helpers={"result": REGISTRY["result"]})
    assert "Search the web." not in small
    assert "Search the web." in render_prompt(p, helpers=REGISTRY)


def test_examples_keep_their_own_headings() -> None:
    seed_style = persona(
        examples="## Example Workflows\n\n### Example 1: Look\n\n<helpers>\nx = 1\n</helpers>\n"
    )
    prompt = render_prompt(seed_style, helpers=REGISTRY)
    assert prompt.count("## Example Workflows") == 1
    assert "### Example 1: Look" in prompt
    numbered = render_prompt(persona(examples=["first", "### Named\n\nsecond"]), helpers=REGISTRY)
    assert "### Example 1\n\nfirst\n\n### Named\n\nsecond" in numbered


def test_prompt_of_a_user_persona_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("identity: You are mine.\nfeatured_helpers: [result]\n")
    prompt = build_prompt(load_persona_file(path))
    assert prompt.startswith("You are mine.\n")
    assert "### result(value: Any) -> None" in prompt


def test_tau2_prompts_document_every_tool() -> None:
    personas = load_personas(SHIPPED_DIR)
    for name in ("tau2-retail", "tau2-airline"):
        prompt = build_prompt(personas[name])
        for tool in personas[name].custom_tools:
            assert f"### {tool.name}(" in prompt, (name, tool.name)


# -- JSON Schema to Python --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string"}, "str"),
        ({"type": "integer"}, "int"),
        ({"type": "number"}, "float"),
        ({"type": "boolean"}, "bool"),
        ({"type": "array", "items": {"type": "string"}}, "list[str]"),
        ({"type": "array"}, "list"),
        ({"type": "object"}, "dict"),
        ({"type": ["string", "null"]}, "str | None"),
        ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "int | str"),
        ({"enum": ["a", "b"]}, "Literal['a', 'b']"),
        ({"const": 3}, "Literal[3]"),
        ({"$ref": "#/$defs/Order"}, "Order"),
        ({}, "Any"),
    ],
)
def test_annotation(schema: dict[str, object], expected: str) -> None:
    assert annotation(schema) == expected


def test_signature_puts_required_first_and_is_keyword_only() -> None:
    schema = {
        "type": "object",
        "properties": {
            "limit": {"type": "integer", "default": 10},
            "query": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["query"],
    }
    assert signature("search", schema, returns="list[dict]") == (
        "search(*, query: str, limit: int = 10, tags: list[str] | None = None) -> list[dict]"
    )
    assert signature("ping", {"type": "object"}) == "ping() -> Any"


def test_nested_shapes_are_shown() -> None:
    doc = FunctionToolDoc(
        name="book",
        description="Book it.",
        parameters={
            "type": "object",
            "properties": {
                "flights": {
                    "type": "array",
                    "description": "Segments.",
                    "items": {
                        "type": "object",
                        "properties": {"number": {"type": "string"}, "date": {"type": "string"}},
                        "required": ["number"],
                    },
                }
            },
            "required": ["flights"],
        },
    ).render()
    assert doc == (
        "### book(*, flights: list[dict]) -> Any\nBook it.\nParameters:\n"
        "- flights: Segments. Shape: [{number: str, date?: str}, ...].\n"
    )
