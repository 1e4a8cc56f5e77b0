"""``llm_call(expr_list, instructions)``: ask the model a sub-question from inside a block."""

from __future__ import annotations

import json
from typing import Any

from app.helpers.base import HelperContext, HelperError, HelperSpec, bind_arguments
from app.llm.base import LLMMessage

SYSTEM = (
    "You are a careful assistant called from a program. Follow the instructions exactly, using only "
    "the data given. Answer with the result alone: no preamble, no code blocks unless asked."
)
MAX_DATA_CHARS = 400_000


def _render(item: Any) -> str:
    """One data item as text (strings as they are, everything else as JSON)."""
    if isinstance(item, str):
        return item
    return json.dumps(item, ensure_ascii=False, default=str, indent=1)


def render_data(data: Any, *, helper: str) -> str:
    """``data`` (a value or a list of values) as numbered ``<data>`` sections for a prompt; a
    HelperError when it is over the size limit."""
    items = data if isinstance(data, list) else [data]
    body = "\n\n".join(f"<data index={i}>\n{_render(x)}\n</data>" for i, x in enumerate(items))
    if len(body) > MAX_DATA_CHARS:
        raise HelperError(f"{helper}: data is {len(body)} characters, the limit is {MAX_DATA_CHARS}")
    return body


async def llm_call(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> str:
    """Run one completion over ``expr_list`` with ``instructions``; returns the model's text."""
    params = bind_arguments(
        "llm_call(expr_list, instructions)", args, kwargs, positional=("expr_list", "instructions")
    )
    instructions = params["instructions"]
    if not isinstance(instructions, str) or not instructions.strip():
        raise HelperError("llm_call: instructions must be a non-empty string")
    body = render_data(params["expr_list"], helper="llm_call")
    response = await ctx.llm.complete(
        model=ctx.model,
        instructions=SYSTEM,
        messages=[LLMMessage(role="user", content=f"{body}\n\nInstructions: {instructions}")],
        stop_at_helpers=False,
    )
    ctx.usage.add_llm(response.usage)
    return response.text.strip()


SPEC = HelperSpec(
    name="llm_call",
    signature="llm_call(expr_list: list | str, instructions: str) -> str",
    doc="""
Ask the model to analyse, summarise, extract or compare, over the data you pass.
`expr_list` is a value or a list of values (strings, numbers, dicts, lists); `instructions` says
what to do with them. Returns the model's answer as a string.
Example:
    summary = llm_call([article_text], "Summarise in three bullet points")
""",
    runs="service",
    handler=llm_call,
)
