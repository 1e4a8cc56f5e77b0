"""``helpers(term)``: list or search the helpers available in the namespace."""

from __future__ import annotations

from typing import Any

from app.helpers.base import HelperContext, HelperError, HelperSpec, bind_arguments


async def helpers(ctx: HelperContext, args: list[Any], kwargs: dict[str, Any]) -> str:
    """Every helper's signature and first doc line, or the full docs of those matching ``term``."""
    from app.helpers import HELPERS  # the registry imports this module

    usage = 'helpers() or helpers("search term")'
    term = bind_arguments(usage, args, kwargs, positional=("term",), defaults={"term": None})["term"]
    if term is not None and not isinstance(term, str):
        raise HelperError(f"term must be a string; usage: {usage}")
    specs = sorted(HELPERS.values(), key=lambda s: s.name)
    if term:
        needle = term.lower()
        found = [s for s in specs if needle in s.name.lower() or needle in s.doc.lower()]
        if not found:
            return f"No helper matches {term!r}. Call helpers() to list them all."
        return "\n".join(spec.render() for spec in found)
    return "\n".join(f"{s.signature}: {_summary(s.doc)}" for s in specs)


def _summary(doc: str) -> str:
    """The first sentence of a helper's docs."""
    text = " ".join(doc.split())
    head, dot, _ = text.partition(". ")
    return head + dot.strip()


SPEC = HelperSpec(
    name="helpers",
    signature="helpers(term: str | None = None) -> str",
    doc="""
List the helpers available in this runtime (signature and summary), or with a search term the
full documentation of the helpers whose name or description mentions it.
Example:
    print(helpers("csv"))
""",
    runs="service",
    handler=helpers,
)
