"""Prompt size of each shipped persona next to the same persona documenting every helper in full.

The point of featured helpers is that a specialist pays for the docs it uses, not for the whole
helper library (``helpers()`` reaches the rest at run time). Two tables: the helpers registered in
this build, then an estimate for the full library, where each helper that is not registered yet
gets docs as long as the registered helpers' average. Run: ``uv run python bench/persona_prompt_sizes.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.helpers import HELPERS, HelperSpec
from app.personas.loader import PENDING_HELPERS, PersonaError, check_personas
from app.personas.models import Persona
from app.personas.prompt import featured, render_prompt
from app.personas.tokens import count_tokens, tokenizer_name


def table(personas: Mapping[str, Persona], helpers: Mapping[str, HelperSpec], title: str) -> None:
    """One row per persona: helpers documented, custom tools, tokens, all-helpers tokens, ratio."""
    print(f"\n{title}")
    header = f"{'persona':<16}{'helpers':>9}{'tools':>7}{'prompt':>9}{'all helpers':>13}{'ratio':>8}"
    print(header)
    print("-" * len(header))
    for name in sorted(personas):
        persona = personas[name]
        tokens = count_tokens(render_prompt(persona, helpers=helpers))
        everything = persona.model_copy(update={"featured_helpers": ("*",)})
        full = count_tokens(render_prompt(everything, helpers=helpers))
        documented = len(featured(persona, helpers=helpers))
        tools = len(persona.custom_tools)
        print(f"{name:<16}{documented:>9}{tools:>7}{tokens:>9}{full:>13}{tokens / full:>8.2f}")


def with_pending(helpers: Mapping[str, HelperSpec]) -> dict[str, HelperSpec]:
    """The registry plus a stand-in for each pending helper, its docs the registered average."""
    average = sum(len(s.doc) for s in helpers.values()) // max(len(helpers), 1)
    filler = ("Documentation of this helper: what it takes, what it returns, an example. " * 20)[:average]
    stand_ins = {
        name: HelperSpec(name=name, signature=f"{name}(...) -> Any", doc=filler, runs="service")
        for name in sorted(PENDING_HELPERS - set(helpers))
    }
    return {**helpers, **stand_ins}


def main() -> None:
    """Print both tables."""
    check = check_personas()
    if check.errors:
        raise PersonaError(check.errors)
    print(f"tokenizer: {tokenizer_name()}")
    table(check.personas, HELPERS, f"registered helpers ({len(HELPERS)}: {', '.join(sorted(HELPERS))})")
    full = with_pending(HELPERS)
    if len(full) > len(HELPERS):
        table(
            check.personas,
            full,
            f"estimate with the full helper library ({len(full)} helpers, stand-in docs)",
        )


if __name__ == "__main__":
    main()
