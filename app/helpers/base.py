"""What a parent-side helper gets: the LLM, the model, and the turn's usage counters."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from app.llm.base import LLMClient, LLMUsage

if TYPE_CHECKING:
    from app.personas.models import Network


@dataclass(slots=True)
class Usage:
    """Running totals of one turn (all LLM calls, the loop's and the helpers')."""

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


HelperFn = Callable[[HelperContext, list[Any], dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class HelperSpec:
    """A helper in the sandbox namespace: its signature and docs for the prompt, and where it runs."""

    name: str
    signature: str
    doc: str
    runs: Literal["parent", "sandbox"]
    handler: HelperFn | None = None

    def render(self) -> str:
        """Full documentation block for the prompt."""
        return f"### {self.signature}\n{self.doc.strip()}\n"


class HelperError(Exception):
    """A helper refused its arguments or failed; the message is shown to the model."""
