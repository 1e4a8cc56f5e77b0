"""What a parent-side helper gets: the LLM, the model, and the turn's usage counters."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from app.llm.base import LLMClient, LLMUsage

if TYPE_CHECKING:
    from app.helpers.net import FetchLimits
    from app.personas.models import Network


class Usage(BaseModel):
    """Token and call totals: a turn's running ones (all LLM calls, the loop's and the helpers'), as
    stored with the turn and as the API shows them for a turn or a conversation."""

    # Fields with defaults are always sent: required in the response schema (no "unset" in SDKs).
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0
    iterations: int = 0

    def add_llm(self, usage: LLMUsage) -> None:
        """Count one completion."""
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.llm_calls += 1


@dataclass(slots=True)
class HelperContext:
    """Everything a parent-side helper may use; authority comes from here, never from the code."""

    llm: LLMClient
    model: str
    usage: Usage = field(default_factory=Usage)
    # The conversation's working directory (the sandbox's cwd): where downloads are written.
    workdir: Path | None = None
    # The persona's network policy for helpers that fetch over the network (None: the default).
    network: Network | None = None
    # Runs a sub-task in a fresh child conversation (``sabre_call``): (description, data) -> answer.
    subtask: Callable[[str, list[Any]], Awaitable[str]] | None = None
    # How deep in nested sub-tasks this context is (0: the conversation's own turn).
    depth: int = 0
    # The ``helper.started`` event of the helper call running now: a sub-task's events nest under it.
    current_event: str | None = None
    # Caps of every fetch by the network helpers (None: the service's SABRE_FETCH_* settings).
    fetch_limits: FetchLimits | None = None


HelperFn = Callable[[HelperContext, list[Any], dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class HelperSpec:
    """A helper in the sandbox namespace: its signature and docs for the prompt, and who runs it
    (the service, its ``handler``; or the sandbox: ``app.runtime.library``)."""

    name: str
    signature: str
    doc: str
    runs: Literal["service", "sandbox"]
    handler: HelperFn | None = None

    def render(self) -> str:
        """Full documentation block for the prompt."""
        return f"### {self.signature}\n{self.doc.strip()}\n"


class HelperError(Exception):
    """A helper refused its arguments or failed; the message is shown to the model."""


def bind_arguments(
    usage: str,
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    positional: Sequence[str],
    defaults: Mapping[str, Any] | None = None,
    keyword_only: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The call's arguments by name, as Python would bind them to ``usage``, defaults filled in.

    ``positional`` names may be passed either way (those without a default are required);
    ``keyword_only`` names only by keyword. A call that would not bind raises HelperError naming
    the problem and the usage, which is what the model needs to fix its call.
    """
    defaults = defaults or {}
    keyword_only = keyword_only or {}
    if len(args) > len(positional):
        raise HelperError(f"too many positional arguments; usage: {usage}")
    bound = dict(zip(positional, args, strict=False))
    for name, value in kwargs.items():
        if name in bound:
            raise HelperError(f"got multiple values for {name!r}; usage: {usage}")
        if name not in positional and name not in keyword_only:
            raise HelperError(f"unexpected argument {name!r}; usage: {usage}")
        bound[name] = value
    missing = [n for n in positional if n not in bound and n not in defaults]
    if missing:
        raise HelperError(f"missing required argument {missing[0]!r}; usage: {usage}")
    return {**defaults, **keyword_only, **bound}
