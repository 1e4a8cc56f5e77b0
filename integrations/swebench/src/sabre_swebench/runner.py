"""Run instances through SABRE: a checkout each, the tools executed here, predictions appended.

One instance is one conversation: the first turn gets the problem statement and the two tools; while
the turn waits for tool results, the runner runs every pending call in the checkout (in order: they
share a working tree) and answers them in one POST. A completed turn's ``git diff`` against the base
commit is the prediction. Anything else (a failed or expired turn, SABRE unreachable, a limit hit, a
checkout that cannot be made) is one readable line in the summary, and the next instance runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel

from sabre_swebench import checkout
from sabre_swebench.client import PendingCall, SabreClient, SabreError
from sabre_swebench.instances import Instance, Prediction, append_jsonl, finished_ids
from sabre_swebench.tools import TOOL_SCHEMAS, Toolbox, ToolFailure, ToolLimits

PREDICTIONS: Final = "predictions.jsonl"
REPORT: Final = "report.jsonl"
TASK_TEMPLATE: Final = """\
<issue>
{problem_statement}
</issue>

You are working in a checkout of the repository {repo} at commit {commit}. Resolve the issue above by \
editing the repository's source files (not its tests): find the relevant code, reproduce the problem \
if you can, make the smallest correct change, and check it. The tools `bash(command)` and \
`str_replace_editor(command, path, ...)` act on that checkout (paths relative to the repository \
root); your own FS and Bash helpers do not see it. Calls that do not depend on each other can be \
made together. When you are done, answer with a one-paragraph summary of the change; the runner takes \
the final `git diff` as your patch.
"""

Status = Literal["patched", "empty", "failed"]


class Outcome(BaseModel):
    """One instance's result: a line of ``report.jsonl`` and of the summary table."""

    instance_id: str
    status: Status
    error: str | None = None
    conversation_id: str | None = None
    tool_calls: int = 0
    pauses: int = 0
    """Turns that stopped for tool results (each answered by one POST)."""
    round_trips: int = 0
    """HTTP requests to SABRE (the first turn plus one per pause)."""
    sabre_seconds: float = 0.0
    """Time spent waiting for SABRE (its model calls and blocks included)."""
    tool_seconds: float = 0.0
    """Time spent running the tools in the checkout."""
    setup_seconds: float = 0.0
    """Checkout and final diff."""
    total_seconds: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    patch_lines: int = 0


@dataclass(frozen=True)
class RunConfig:
    """What a run needs besides the instances."""

    output_dir: Path
    workdir: Path
    repos_dir: Path | None = None
    repo_path: Path | None = None
    persona: str = "default"
    model: str | None = None
    model_name_or_path: str = "sabre"
    max_iterations: int | None = None
    workers: int = 2
    limits: ToolLimits = field(default_factory=ToolLimits)
    max_tool_calls: int = 300
    instance_timeout: float = 3600.0
    keep_checkouts: bool = False


def task_input(instance: Instance) -> str:
    """The first user message of an instance's conversation."""
    return TASK_TEMPLATE.format(
        problem_statement=instance.problem_statement.strip(),
        repo=instance.repo,
        commit=instance.base_commit[:12],
    )


class _Limit(Exception):
    """A run limit of the instance was reached."""


@dataclass
class _Clock:
    """Where an instance's time went."""

    outcome: Outcome
    started: float = field(default_factory=time.perf_counter)

    async def sabre(self, request: Any) -> Any:
        began = time.perf_counter()
        try:
            return await request
        finally:
            self.outcome.sabre_seconds += time.perf_counter() - began
            self.outcome.round_trips += 1


async def run_instance(instance: Instance, *, config: RunConfig, client: SabreClient) -> Outcome:
    """Run one instance to an outcome (never raises for the instance's own failures)."""
    outcome = Outcome(instance_id=instance.instance_id, status="failed")
    clock = _Clock(outcome)
    target = config.workdir / instance.instance_id
    try:
        async with asyncio.timeout(config.instance_timeout):
            began = time.perf_counter()
            source = checkout.find_source(
                instance.repo, repos_dir=config.repos_dir, repo_path=config.repo_path
            )
            await checkout.prepare(source, instance.base_commit, target=target)
            outcome.setup_seconds += time.perf_counter() - began
            await _converse(instance, config=config, client=client, clock=clock, root=target)
            began = time.perf_counter()
            patch = await checkout.final_patch(target, instance.base_commit)
            outcome.setup_seconds += time.perf_counter() - began
    except TimeoutError:
        outcome.error = f"timed out after {config.instance_timeout:g} s"
    except (SabreError, checkout.CheckoutError, _Limit, OSError) as exc:
        outcome.error = str(exc) or type(exc).__name__
    except Exception as exc:  # whatever else went wrong is this instance's line, not the run's end
        outcome.error = f"{type(exc).__name__}: {exc}"
    else:
        outcome.status = "patched" if patch.strip() else "empty"
        outcome.patch_lines = patch.count("\n")
        append_jsonl(
            config.output_dir / PREDICTIONS,
            [
                Prediction(
                    instance_id=instance.instance_id,
                    model_name_or_path=config.model_name_or_path,
                    model_patch=patch,
                )
            ],
        )
    finally:
        outcome.total_seconds = time.perf_counter() - clock.started
        if not config.keep_checkouts:
            await checkout.remove(target)
    append_jsonl(config.output_dir / REPORT, [outcome])
    return outcome


async def _converse(
    instance: Instance, *, config: RunConfig, client: SabreClient, clock: _Clock, root: Path
) -> None:
    outcome = clock.outcome
    body: dict[str, Any] = {
        "input": task_input(instance),
        "persona": config.persona,
        "tools": TOOL_SCHEMAS,
        "metadata": {"swebench_instance": instance.instance_id[:200], "runner": "sabre-swebench"},
    }
    if config.model:
        body["model"] = config.model
    if config.max_iterations:
        body["max_iterations"] = config.max_iterations
    turn = await clock.sabre(client.start(body))
    outcome.conversation_id = turn.conversation_id
    toolbox = Toolbox(root, limits=config.limits)
    while turn.status == "awaiting_tool_results":
        _count_usage(outcome, turn.usage.input_tokens, turn.usage.output_tokens)
        if outcome.tool_calls + len(turn.pending_tool_calls) > config.max_tool_calls:
            raise _Limit(f"more than {config.max_tool_calls} tool calls (raise --max-tool-calls)")
        outcome.pauses += 1
        results = [await _execute(call, toolbox=toolbox, outcome=outcome) for call in turn.pending_tool_calls]
        turn = await clock.sabre(client.answer(turn.conversation_id, results))
    _count_usage(outcome, turn.usage.input_tokens, turn.usage.output_tokens)
    if turn.status != "completed":
        reason = f"{turn.error.code}: {turn.error.message}" if turn.error else "no error given"
        raise SabreError(f"turn {turn.status} ({reason})")


async def _execute(call: PendingCall, *, toolbox: Toolbox, outcome: Outcome) -> dict[str, Any]:
    began = time.perf_counter()
    outcome.tool_calls += 1
    try:
        return {"tool_call_id": call.id, "output": await toolbox.run(call.name, call.arguments)}
    except ToolFailure as exc:
        return {"tool_call_id": call.id, "error": str(exc)[:20_000]}
    finally:
        outcome.tool_seconds += time.perf_counter() - began


def _count_usage(outcome: Outcome, input_tokens: int, output_tokens: int) -> None:
    # Each turn's usage is its own; a paused and resumed turn reports what it used so far.
    outcome.input_tokens = max(outcome.input_tokens, input_tokens)
    outcome.output_tokens = max(outcome.output_tokens, output_tokens)


async def run_all(
    instances: list[Instance],
    *,
    config: RunConfig,
    client: SabreClient,
    on_start: Callable[[Instance], None] | None = None,
    on_done: Callable[[Outcome], None] | None = None,
) -> tuple[list[Outcome], list[str]]:
    """Run the instances not in ``predictions.jsonl`` yet, ``config.workers`` at a time.

    Returns the outcomes (in the instances' order) and the ids skipped as already finished.
    """
    config.output_dir.mkdir(parents=True, exist_ok=True)
    done = finished_ids(config.output_dir / PREDICTIONS)
    skipped = [i.instance_id for i in instances if i.instance_id in done]
    todo = [i for i in instances if i.instance_id not in done]
    gate = asyncio.Semaphore(max(1, config.workers))

    async def one(instance: Instance) -> Outcome:
        async with gate:
            if on_start is not None:
                on_start(instance)
            outcome = await run_instance(instance, config=config, client=client)
            if on_done is not None:
                on_done(outcome)
            return outcome

    outcomes = await asyncio.gather(*(one(instance) for instance in todo))
    return list(outcomes), skipped
