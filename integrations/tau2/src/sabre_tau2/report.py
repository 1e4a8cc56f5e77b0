"""Per-task figures of a tau2 run: reward, termination, and what the agent cost in SABRE round trips.

    python -m sabre_tau2.report data/simulations/RUN/results.json [--min-reward-tasks N]

For the ``sabre`` agent every agent message after tau2's greeting is one HTTP round trip to SABRE
(a turn started, continued or resumed); a message with tool calls is one pause, however many calls
it carries. For another agent the same counts are its model calls and tool-call messages.
Exit status 1 when a simulation has no reward, ended in an agent error, or fewer than N tasks got
reward 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def task_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per simulation: task, reward, termination, round trips, pauses, tool calls."""
    rows = []
    for sim in results.get("simulations") or []:
        messages = sim.get("messages") or []
        # Generated messages carry usage; tau2's greeting and a task's seeded history do not.
        agent = [m for m in messages if m.get("role") == "assistant" and m.get("usage") is not None]
        reward_info = sim.get("reward_info") or {}
        rows.append(
            {
                "task": sim.get("task_id"),
                "reward": reward_info.get("reward"),
                "termination": sim.get("termination_reason"),
                "round_trips": len(agent),
                "pauses": sum(1 for m in agent if m.get("tool_calls")),
                "tool_calls": sum(len(m.get("tool_calls") or []) for m in agent),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the table; the exit status as documented above."""
    parser = argparse.ArgumentParser(description="Per-task figures of a tau2 results.json")
    parser.add_argument("results", type=Path)
    parser.add_argument("--min-reward-tasks", type=int, default=0)
    parser.add_argument("--label", default="")
    args = parser.parse_args(argv)
    rows = task_rows(json.loads(args.results.read_text()))
    print(f"{args.label or args.results}")
    print(f"{'task':48} {'reward':>6} {'trips':>5} {'pauses':>6} {'calls':>5}  termination")
    for r in rows:
        reward = "-" if r["reward"] is None else f"{r['reward']:.1f}"
        print(
            f"{r['task']:48} {reward:>6} {r['round_trips']:>5} {r['pauses']:>6} {r['tool_calls']:>5}  "
            f"{r['termination']}"
        )
    rewarded = sum(1 for r in rows if r["reward"] == 1.0)
    print(
        f"{'total':48} {rewarded:>4}/{len(rows)} {sum(r['round_trips'] for r in rows):>5} "
        f"{sum(r['pauses'] for r in rows):>6} {sum(r['tool_calls'] for r in rows):>5}"
    )
    problems = [r for r in rows if r["reward"] is None or r["termination"] == "agent_error"]
    for r in problems:
        print(f"FAIL {r['task']}: reward {r['reward']}, termination {r['termination']}", file=sys.stderr)
    if rewarded < args.min_reward_tasks:
        print(f"FAIL only {rewarded} tasks got reward 1 (expected {args.min_reward_tasks})", file=sys.stderr)
    return 1 if problems or rewarded < args.min_reward_tasks else 0


if __name__ == "__main__":
    sys.exit(main())
