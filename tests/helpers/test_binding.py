"""llm_bind, llm_list_bind and coerce against the scripted LLM, over real HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.helpers import HelperContext, HelperError
from app.helpers.binding import llm_bind, llm_list_bind, parse_signature
from app.helpers.coerce import coerce
from app.helpers.llm_json import parse_json_reply
from app.llm.scripted import Reply, ScriptedLLM

BIO = "Ada Lovelace was born in London in 1815 and wrote the first published algorithm."


async def test_llm_bind_returns_the_arguments(ctx: HelperContext, scripted: ScriptedLLM) -> None:
    scripted.script('{"arguments": {"name": "Ada Lovelace", "born": 1815, "city": "London"}}')
    person = await llm_bind(ctx, [BIO, "person(name: str, born: int, city: str | None = None) -> dict"], {})
    assert person == {"name": "Ada Lovelace", "born": 1815, "city": "London"}
    [request] = scripted.requests
    assert BIO in request.all_text
    assert "def person(name: str, born: int, city: str | None=None) -> dict" in request.all_text
    assert request.stop == []  # a helper's completion is not cut at </helpers>
    assert request.model == "scripted-model"
    assert ctx.usage.llm_calls == 1
    assert ctx.usage.input_tokens > 0


async def test_llm_bind_reads_fenced_json_and_fills_defaults(
    ctx: HelperContext, scripted: ScriptedLLM
) -> None:
    scripted.script('Here you go:\n```json\n{"arguments": {"name": "Ada", "lang": null}}\n```')
    bound = await llm_bind(
        ctx, [], {"data": BIO, "signature": "def f(name: str, lang: str = 'en', *, n: int = 1):"}
    )
    assert bound == {"name": "Ada", "lang": "en", "n": 1}


async def test_llm_bind_returns_the_declared_result(ctx: HelperContext, scripted: ScriptedLLM) -> None:
    scripted.script('{"arguments": {"person": "Ada Lovelace"}, "result": 1815}')
    assert await llm_bind(ctx, [BIO, "birth_year(person: str) -> int"], {}) == 1815
    assert '"result"' in scripted.requests[0].all_text
    scripted.script('{"arguments": {"text": "..."}, "result": [{"name": "Ada", "year": 1815}]}')
    assert await llm_bind(ctx, [BIO, "people(text: str) -> list[dict]"], {}) == [
        {"name": "Ada", "year": 1815}
    ]


async def test_llm_bind_retries_once_with_the_problem(ctx: HelperContext, scripted: ScriptedLLM) -> None:
    scripted.script(
        '{"arguments": {"name": "Ada", "born": "eighteen fifteen"}}',
        '{"arguments": {"name": "Ada", "born": 1815}}',
    )
    assert await llm_bind(ctx, [BIO, "person(name: str, born: int)"], {}) == {"name": "Ada", "born": 1815}
    retry = scripted.requests[1]
    assert "parameter 'born': 'eighteen fifteen' is not int" in retry.last_user_text
    assert [m.role for m in retry.messages] == ["user", "assistant", "user"]
    assert ctx.usage.llm_calls == 2


async def test_llm_bind_gives_up_after_one_retry(ctx: HelperContext, scripted: ScriptedLLM) -> None:
    scripted.script("Sure! The name is Ada.", "{not json")
    with pytest.raises(
        HelperError,
        match="llm_bind: the model did not return a usable answer after a retry: it is not valid JSON",
    ):
        await llm_bind(ctx, [BIO, "person(name: str)"], {})
    assert len(scripted.requests) == 2
    assert "not valid JSON" in scripted.requests[1].last_user_text


async def test_llm_bind_unknown_parameters_are_retried(ctx: HelperContext, scripted: ScriptedLLM) -> None:
    scripted.script('{"arguments": {"name": "Ada", "age": 36}}', '{"arguments": {"name": "Ada"}}')
    assert await llm_bind(ctx, [BIO, "person(name: str)"], {}) == {"name": "Ada"}
    assert "unknown parameter(s) age" in scripted.requests[1].last_user_text


async def test_llm_bind_missing_required_value(ctx: HelperContext, scripted: ScriptedLLM) -> None:
    scripted.script('{"arguments": {"name": "Ada", "email": null}}')
    with pytest.raises(HelperError, match="the data gives no value for 'email'"):
        await llm_bind(ctx, [BIO, "contact(name: str, email: str)"], {})
    scripted.script('{"arguments": {"name": "Ada", "email": null}}')
    assert await llm_bind(ctx, [BIO, "contact(name: str, email: str | None)"], {}) == {
        "name": "Ada",
        "email": None,
    }


@pytest.mark.parametrize(
    ("signature", "message"),
    [
        ("not a signature", "is not a function signature"),
        ("f(*args)", "cannot take \\*args"),
        ("f()", "no parameters"),
        ("f(x=len('a'))", "must be a literal"),
        (42, "signature must be a string"),
    ],
)
async def test_llm_bind_bad_signatures(
    ctx: HelperContext, scripted: ScriptedLLM, signature: Any, message: str
) -> None:
    with pytest.raises(HelperError, match=message):
        await llm_bind(ctx, ["data", signature], {})
    assert scripted.requests == []


def test_signature_forms() -> None:
    assert [p.name for p in parse_signature("(a: int, b)").params] == ["a", "b"]
    assert parse_signature("person(name: str) -> dict").wants_result is False
    assert parse_signature("person(name: str) -> Person").wants_result is False
    assert parse_signature("person(name: str)").wants_result is False
    assert parse_signature("total(x: str) -> float").wants_result is True


async def test_llm_list_bind(ctx: HelperContext, scripted: ScriptedLLM) -> None:
    scripted.script('["Example Lab", "Acme", "Initech"]')
    assert await llm_list_bind(ctx, ["text", "company names", 2], {}) == ["Example Lab", "Acme"]
    assert "company names" in scripted.requests[0].all_text
    assert "at most 2 items" in scripted.requests[0].all_text
    scripted.script('{"items": [{"name": "a", "price": 1}]}')
    assert await llm_list_bind(ctx, ["text", "products"], {}) == [{"name": "a", "price": 1}]
    scripted.script("[]")
    assert await llm_list_bind(ctx, ["text"], {"instructions": "nothing", "count": None}) == []


async def test_llm_list_bind_retries_a_non_list(ctx: HelperContext, scripted: ScriptedLLM) -> None:
    scripted.script('"Example Lab"', '["Example Lab"]')
    assert await llm_list_bind(ctx, ["text", "companies"], {}) == ["Example Lab"]
    assert "expected a JSON array" in scripted.requests[1].last_user_text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["text", ""], "instructions must be a non-empty string"),
        (["text", "x", 0], "count must be a positive integer"),
        (["text", "x", "3"], "count must be a positive integer"),
        (["text"], "missing required argument 'instructions'"),
    ],
)
async def test_llm_list_bind_bad_calls(
    ctx: HelperContext, scripted: ScriptedLLM, args: list[Any], message: str
) -> None:
    with pytest.raises(HelperError, match=message):
        await llm_list_bind(ctx, args, {})


@pytest.mark.parametrize(
    ("data", "type_", "expected"),
    [
        ("1,234", "<class 'int'>", 1234),
        (" 42 ", "int", 42),
        ("7.0", "int", 7),
        (3.0, "int", 3),
        ("$12.50", "float", 12.5),
        ("-1,000.5", "<class 'float'>", -1000.5),
        (5, "float", 5.0),
        ("yes", "bool", True),
        ("OFF", "<class 'bool'>", False),
        (0, "bool", False),
        ("March 5, 2024", "date", "2024-03-05"),
        ("2024-03-05T10:00:00Z", "<class 'datetime.date'>", "2024-03-05"),
        ("13/04/2024", "date", "2024-04-13"),
        ("2024-03-05 10:30", "datetime", "2024-03-05T10:30:00"),
        (12, "str", "12"),
        ("[1, 2, 3]", "list", [1, 2, 3]),
        (["1", "2,000"], "list[int]", [1, 2000]),
        ('{"a": 1}', "dict", {"a": 1}),
        ("null", "int | None", None),
        ("HIGH", "Literal['low', 'high']", "high"),
    ],
)
async def test_coerce_by_plain_rules_asks_no_model(
    ctx: HelperContext, scripted: ScriptedLLM, data: Any, type_: str, expected: Any
) -> None:
    value = await coerce(ctx, [data, type_], {})
    assert value == expected
    assert type(value) is type(expected)
    assert scripted.requests == []


async def test_coerce_falls_back_to_the_model(ctx: HelperContext, scripted: ScriptedLLM) -> None:
    scripted.script('{"value": 12}')
    assert await coerce(ctx, ["twelve", "int"], {}) == 12
    assert "`int`" in scripted.requests[0].all_text
    assert "twelve" in scripted.requests[0].all_text
    scripted.script('{"value": 12000}')
    assert await coerce(ctx, ["12k", "float"], {}) == 12000.0
    scripted.script('{"value": "2024-03-04"}')
    assert await coerce(ctx, ["03/04/2024", "date"], {}) == "2024-03-04"  # ambiguous: the model decides
    assert ctx.usage.llm_calls == 3


async def test_coerce_checks_the_models_answer(ctx: HelperContext, scripted: ScriptedLLM) -> None:
    scripted.script('{"value": "12"}', '{"value": 12}')
    assert await coerce(ctx, ["twelve", "int"], {}) == 12
    assert "'12' is not int" in scripted.requests[1].last_user_text
    scripted.script('{"error": "not a number"}')
    with pytest.raises(HelperError, match="coerce: cannot convert 'banana' to int: not a number"):
        await coerce(ctx, ["banana", "int"], {})


async def test_coerce_bad_types(ctx: HelperContext) -> None:
    with pytest.raises(HelperError, match="is not a type"):
        await coerce(ctx, ["1", "list["], {})
    with pytest.raises(HelperError, match="type must be a type or its name"):
        await coerce(ctx, ["1", 3], {})
    with pytest.raises(HelperError, match="missing required argument 'type'"):
        await coerce(ctx, ["1"], {})


def test_parse_json_reply() -> None:
    assert parse_json_reply(' {"a": 1} ') == {"a": 1}
    assert parse_json_reply("```\n[1, 2]\n```") == [1, 2]
    assert parse_json_reply('The answer is {"a": [1]} as requested.') == {"a": [1]}
    with pytest.raises(json.JSONDecodeError):
        parse_json_reply("no json here")


async def test_llm_errors_surface(ctx: HelperContext, scripted: ScriptedLLM) -> None:
    from app.llm.base import LLMError

    scripted.script(Reply(status=400, text="bad request"))
    with pytest.raises(LLMError):
        await llm_list_bind(ctx, ["text", "things"], {})
