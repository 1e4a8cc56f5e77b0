"""``sabre_call(description, expr_list)``: delegate a sub-task to a fresh child conversation.

The child gets its own loop, an empty namespace and no history (a clean context is the point), and
shares the working directory. The turn loop provides the runner (``HelperContext.subtask``); this
helper checks the call and bounds the recursion, since a sub-task may itself call ``sabre_call``.
"""

from __future__ import annotations

from typing import Any, Final

from app.helpers.base import HelperContext, HelperError, HelperSpec, bind_arguments
from app.helpers.llm_call import render_data

MAX_DEPTH: Final = 2
"""Sub-tasks may nest this deep: the conversation's turn is depth 0, its sub-task 1, that one's 2."""
MAX_DESCRIPTION_CHARS: Final = 20_000
USAGE: Final = "sabre_call(description, expr_list=None)"


async def sabre_call(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> str:
    """Run ``description`` over ``expr_list`` as a sub-task; returns its final answer."""
    params = bind_arguments(
        USAGE, args, kwargs, positional=("description", "expr_list"), defaults={"expr_list": None}
    )
    description, data = params["description"], params["expr_list"]
    if not isinstance(description, str) or not description.strip():
        raise HelperError("sabre_call: description must be a non-empty string saying what to do")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise HelperError(f"sabre_call: the description is over {MAX_DESCRIPTION_CHARS:,} characters")
    if ctx.subtask is None:
        raise HelperError("sabre_call is not available here")
    if ctx.depth >= MAX_DEPTH:
        raise HelperError(
            f"sabre_call: sub-tasks nest at most {MAX_DEPTH} deep; do this part here instead of delegating it"
        )
    items: list[Any] = [] if data is None else data if isinstance(data, list) else [data]
    render_data(items, helper="sabre_call")  # the same size limit as llm_call's data
    return await ctx.subtask(description.strip(), items)


SPEC = HelperSpec(
    name="sabre_call",
    signature="sabre_call(description: str, expr_list: list | Any = None) -> str",
    doc="""
Delegate a self-contained sub-task to a fresh agent: a new conversation with its own `<helpers>`
loop, an empty namespace and no history, sharing this working directory. `description` says what
to do and what to answer; `expr_list` is the data it needs (a value or a list of values). Returns
the sub-task's final answer as a string; raises an error if it fails. Use it to keep a long or
messy step out of this context; sub-tasks nest at most two deep.
Example:
    report = sabre_call("Summarise the key risks in these filings, one line each", [filing_a, filing_b])
""",
    runs="service",
    handler=sabre_call,
)
