"""``sabre-swe`` (and ``sabre swe``): run SWE-bench instances through a SABRE server.

    sabre-swe instances.jsonl --repos ~/mirrors --out runs/first --workers 4
    python -m swebench.harness.run_evaluation --predictions_path runs/first/predictions.jsonl ...

Exit status: 0 when every instance finished (patched or empty), 1 when some failed (see the summary
and ``report.jsonl``; run the same command again to retry only those), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sabre_swebench.client import SabreClient
from sabre_swebench.instances import Instance, InstanceError, load_instances
from sabre_swebench.runner import PREDICTIONS, REPORT, Outcome, RunConfig, run_all
from sabre_swebench.tools import ToolLimits


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``sabre swe --help`` shows)."""
    parser = argparse.ArgumentParser(
        prog="sabre swe", description="Run SWE-bench instances through SABRE; write predictions.jsonl."
    )
    parser.add_argument("instances", type=Path, help="JSON list or JSON Lines of SWE-bench instances")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--repos", type=Path, help="directory of local clones or mirrors (owner__name)")
    source.add_argument("--repo", type=Path, help="one local repository for every instance")
    parser.add_argument("--out", type=Path, default=Path("swe-run"), help="output directory")
    parser.add_argument("--workdir", type=Path, help="where checkouts go (default OUT/checkouts)")
    parser.add_argument("--url", default=os.environ.get("SABRE_URL", "http://127.0.0.1:8011"))
    parser.add_argument("--api-key", default=os.environ.get("SABRE_API_KEY"), help="or SABRE_API_KEY")
    parser.add_argument("--persona", default="default")
    parser.add_argument("--model", help="the model SABRE uses (default: the server's)")
    parser.add_argument("--name", default="sabre", help="model_name_or_path in the predictions")
    parser.add_argument("--workers", type=int, default=2, help="instances run at once")
    parser.add_argument("--max-iterations", type=int, help="model calls per turn (SABRE's default)")
    parser.add_argument("--max-tool-calls", type=int, default=300)
    parser.add_argument("--tool-timeout", type=float, default=120.0, help="seconds per bash command")
    parser.add_argument("--output-cap", type=int, default=200_000, help="bytes of one tool's output")
    parser.add_argument("--instance-timeout", type=float, default=3600.0, help="seconds per instance")
    parser.add_argument("--keep-checkouts", action="store_true")
    parser.add_argument("--only", action="append", default=[], help="run only this instance id")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse, run, print the summary; the exit status as documented above."""
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    if not console.is_terminal:  # a log file or a pipe: wide rows rather than folded ones
        console = Console(stderr=True, width=200)
    try:
        instances = load_instances(args.instances)
    except InstanceError as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    if args.only:
        wanted = set(args.only)
        instances = [i for i in instances if i.instance_id in wanted]
    if args.workers < 1 or args.max_tool_calls < 1 or args.output_cap < 1_000 or args.tool_timeout <= 0:
        parser.error("--workers, --max-tool-calls must be >= 1, --output-cap >= 1000, --tool-timeout > 0")
    config = RunConfig(
        output_dir=args.out,
        workdir=args.workdir or args.out / "checkouts",
        repos_dir=args.repos,
        repo_path=args.repo,
        persona=args.persona,
        model=args.model,
        model_name_or_path=args.name,
        max_iterations=args.max_iterations,
        workers=args.workers,
        limits=ToolLimits(timeout=args.tool_timeout, output_bytes=args.output_cap),
        max_tool_calls=args.max_tool_calls,
        instance_timeout=args.instance_timeout,
        keep_checkouts=args.keep_checkouts,
    )
    outcomes, skipped = asyncio.run(
        _run(instances, config, url=args.url, api_key=args.api_key, console=console)
    )
    console.print(summary_table(outcomes, skipped=skipped))
    console.print(f"predictions: {config.output_dir / PREDICTIONS}   report: {config.output_dir / REPORT}")
    return 1 if any(o.status == "failed" for o in outcomes) else 0


async def _run(
    instances: list[Instance], config: RunConfig, *, url: str, api_key: str | None, console: Console
) -> tuple[list[Outcome], list[str]]:
    client = SabreClient(url, api_key=api_key)
    progress = Progress(
        TextColumn("[bold]swe[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
        transient=not console.is_terminal,
    )
    running: set[str] = set()
    with progress:
        bar = progress.add_task("instances", total=len(instances), note="")

        def started(instance: Instance) -> None:
            running.add(instance.instance_id)
            progress.update(bar, note=", ".join(sorted(running))[:60])

        def finished(outcome: Outcome) -> None:
            running.discard(outcome.instance_id)
            progress.update(bar, advance=1, note=", ".join(sorted(running))[:60])
            if outcome.status == "failed":
                progress.console.print(f"[red]{outcome.instance_id}[/red]: {outcome.error}")

        try:
            outcomes, skipped = await run_all(
                instances, config=config, client=client, on_start=started, on_done=finished
            )
            progress.update(bar, advance=len(skipped))
        finally:
            await client.aclose()
    return outcomes, skipped


def summary_table(outcomes: list[Outcome], *, skipped: list[str]) -> Table:
    """One row per instance run (skipped ones counted in the caption), totals last."""
    table = Table(title="SWE-bench run", caption=f"{len(skipped)} skipped (already in predictions.jsonl)")
    table.add_column("instance", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for column in ("calls", "pauses", "SABRE s", "tools s", "setup s", "diff lines"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("note", overflow="fold", ratio=1)
    for o in outcomes:
        colour = {"patched": "green", "empty": "yellow", "failed": "red"}[o.status]
        table.add_row(
            o.instance_id,
            f"[{colour}]{o.status}[/{colour}]",
            str(o.tool_calls),
            str(o.pauses),
            f"{o.sabre_seconds:.1f}",
            f"{o.tool_seconds:.1f}",
            f"{o.setup_seconds:.1f}",
            str(o.patch_lines),
            (o.error or "")[:300],
        )
    if outcomes:
        table.add_section()
        table.add_row(
            "total",
            ", ".join(f"{sum(o.status == s for o in outcomes)} {s}" for s in ("patched", "empty", "failed")),
            str(sum(o.tool_calls for o in outcomes)),
            str(sum(o.pauses for o in outcomes)),
            f"{sum(o.sabre_seconds for o in outcomes):.1f}",
            f"{sum(o.tool_seconds for o in outcomes):.1f}",
            f"{sum(o.setup_seconds for o in outcomes):.1f}",
            "",
            "",
        )
    return table


if __name__ == "__main__":
    sys.exit(main())
