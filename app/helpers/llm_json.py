"""Ask the model for one JSON value, check it, and ask once more when the answer is unusable.

Models wrap JSON in code fences or a sentence of prose, or get a shape wrong; the binding helpers
must still return a value the user's code can rely on. So the reply is parsed leniently (fences
stripped, the first JSON value found in prose), checked by the caller, and on failure the model
sees its own answer and the exact problem, once; a second failure is a HelperError.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final, TypeVar

from app.helpers.base import HelperContext, HelperError
from app.llm.base import LLMMessage

T = TypeVar("T")

SYSTEM: Final = (
    "You are a precise data function called from a program. Use only the data given. Answer with "
    "exactly one JSON value as asked: no prose, no explanations, no code fences."
)
RETRY: Final = (
    "Your answer could not be used: {problem}\nAnswer again with only the JSON value asked for, nothing else."
)
_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL)
_MAX_STARTS = 20


class Unusable(ValueError):
    """The model's answer parsed but is not what was asked; the message tells it what to fix."""


def parse_json_reply(text: str) -> Any:
    """The JSON value in a model's reply: the whole reply, a fenced block, or the first value in prose."""
    stripped = text.strip()
    fence = _FENCE.search(stripped)
    if fence:
        stripped = fence.group(1).strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError as error:
        decoder = json.JSONDecoder()
        starts = [i for i, ch in enumerate(stripped) if ch in "{["][:_MAX_STARTS]
        for start in starts:
            try:
                value, _ = decoder.raw_decode(stripped, start)
            except json.JSONDecodeError:
                continue
            return value
        raise error from None


async def ask_json(
    ctx: HelperContext, *, helper: str, prompt: str, check: Callable[[Any], T], system: str = SYSTEM
) -> T:
    """One JSON answer to ``prompt``, passed through ``check`` (which raises Unusable to retry)."""
    messages = [LLMMessage(role="user", content=prompt)]
    problem = ""
    for attempt in range(2):
        response = await ctx.llm.complete(
            model=ctx.model, instructions=system, messages=messages, stop_at_helpers=False
        )
        ctx.usage.add_llm(response.usage)
        try:
            return check(parse_json_reply(response.text))
        except json.JSONDecodeError as exc:
            problem = f"it is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        except Unusable as exc:
            problem = str(exc)
        if attempt == 0:
            messages += [
                LLMMessage(role="assistant", content=response.text or "(empty)"),
                LLMMessage(role="user", content=RETRY.format(problem=problem)),
            ]
    raise HelperError(f"{helper}: the model did not return a usable answer after a retry: {problem}")
