"""Where a sandboxed block's CPU goes: the fork itself, and each process of the sandbox.

Prints two tables (markdown):

1. ``fork()`` + ``_exit()`` of a process holding the preloaded modules (numpy, pandas, matplotlib by
   default) and of one holding only the runtime: the kernel's page-table copy and teardown, which
   every fresh block pays once (and which only a smaller heap makes cheaper).
2. CPU per trivial block by process (the server's own, bubblewrap, the zygote, the workers, the
   blocks' processes), for a fresh fork (a new conversation's first block) and for the next block
   of a conversation whose process is live, under each sandbox that runs here (``bwrap``,
   ``process``): which side of the relay to make cheaper.

CPU comes from /proc (user + system, reaped children included), so it counts the kernel's work.
Run: ``uv run python bench/fork_bench.py [--blocks 300] [--preload numpy,pandas,matplotlib]``.
Nothing is asserted: the machines are noisy, compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from app.runtime import RuntimePool
from app.runtime.isolation import SandboxMode, find_bwrap
from app.runtime.pool import bwrap_problem
from bench.runtime_bench import Bench

ROOT = Path(__file__).resolve().parents[1]
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROLES = ("server", "bwrap", "zygote", "workers", "blocks")

_FORK_PROBE = """\
import gc, importlib, os, resource, sys, time
for name in filter(None, sys.argv[1].split(",")):
    importlib.import_module(name)
import app.runtime.worker  # what every worker holds besides
gc.collect()
gc.freeze()
def cpu():
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
rounds = int(sys.argv[2])
started = cpu()
for _ in range(rounds):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
rss = int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
print(f"{(cpu() - started) / rounds * 1e3:.2f} {rss:.1f}")
"""


def fork_cost(preload: Sequence[str], rounds: int) -> tuple[float, float]:
    """(CPU ms per fork + exit, RSS MiB) of a process that imported ``preload``."""
    output = subprocess.run(
        [sys.executable, "-c", _FORK_PROBE, ",".join(preload), str(rounds)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(output[0]), float(output[1])


def _stat(pid: int) -> tuple[float, float]:
    """(own CPU seconds, reaped children's CPU seconds) of ``pid``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:13]) / _CLOCK_TICKS, sum(
        int(f) for f in fields[13:15]
    ) / _CLOCK_TICKS


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listing:
            found += [int(c) for c in listing.read().split()]
    return found


def _command(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read()


def cpu_by_role(server: int) -> dict[str, float]:
    """CPU seconds so far of each kind of process below (and including) ``server``."""
    totals = dict.fromkeys(ROLES, 0.0)
    totals["server"] = _stat(server)[0]

    def walk(pid: int, parent_role: str) -> None:
        for child in _children(pid):
            try:
                own, reaped = _stat(child)
                command = _command(child)
            except (FileNotFoundError, ProcessLookupError):
                continue
            if b"bwrap" in command.split(b"\0")[0]:
                totals["bwrap"] += own
                walk(child, "bwrap")
            elif b"--zygote" in command and parent_role in ("server", "bwrap"):
                totals["zygote"] += own
                walk(child, "zygote")
            elif parent_role == "zygote":
                totals["workers"] += own
                totals["blocks"] += reaped  # the workers reap their blocks' processes
                walk(child, "worker")
            elif parent_role == "worker":
                totals["blocks"] += own + reaped
            else:
                walk(child, parent_role)

    walk(server, "server")
    return totals


async def cpu_per_block(
    sandbox: SandboxMode, preload: Sequence[str], *, blocks: int, live: bool
) -> dict[str, float]:
    """CPU ms per trivial block by role: each a new conversation's first block (``live=False``),
    or the next block of one conversation whose process stays live."""
    workspaces = Path(tempfile.mkdtemp(prefix="sabre-fork-bench-", dir="/var/tmp"))
    async with RuntimePool(
        size=2, preload=preload, sandbox=sandbox, workspaces=workspaces, live_seconds=60.0 if live else 0.0
    ) as pool:
        workdir = workspaces / "conversation"
        workdir.mkdir()
        bench = Bench(pool, workdir, 2)
        state: bytes | None = None

        async def block() -> None:
            nonlocal state
            outcome = await bench.run("x = 1", snapshot=state if live else None)
            assert outcome.status == "ok", outcome.error
            if live and outcome.snapshot is not None:
                state = outcome.snapshot

        for _ in range(20):
            await block()
        await asyncio.sleep(0.2)  # the last fresh fork's rearm
        before = cpu_by_role(os.getpid())
        for _ in range(blocks):
            await block()
        await asyncio.sleep(0.2)
        after = cpu_by_role(os.getpid())
    return {role: (after[role] - before[role]) / blocks * 1e3 for role in ROLES}


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    print(f"### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


async def main(blocks: int, preload: Sequence[str]) -> None:
    heavy, lean = fork_cost(preload, 200), fork_cost((), 200)
    table(
        "1. fork() + _exit() (CPU ms, parent and child)",
        ["process", "RSS MiB", "CPU ms"],
        [
            [
                f"holding {', '.join(preload) or 'nothing more'} and the runtime",
                f"{heavy[1]:.1f}",
                f"{heavy[0]:.2f}",
            ],
            ["holding only the runtime", f"{lean[1]:.1f}", f"{lean[0]:.2f}"],
        ],
    )
    sandboxes: list[SandboxMode] = ["process"]
    with tempfile.TemporaryDirectory(dir="/var/tmp") as probe:
        if find_bwrap() is not None and await bwrap_problem(Path(probe)) is None:
            sandboxes.insert(0, "bwrap")
    rows = []
    for sandbox in sandboxes:
        for live in (False, True):
            costs = await cpu_per_block(sandbox, preload, blocks=blocks, live=live)
            rows.append(
                [
                    sandbox,
                    "live" if live else "fresh",
                    *(f"{costs[r]:.3f}" for r in ROLES),
                    f"{sum(costs.values()):.3f}",
                ]
            )
    table(
        f"2. CPU ms per trivial block by process ({blocks} blocks each)",
        ["sandbox", "block", *ROLES, "total"],
        rows,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--blocks", type=int, default=300)
    parser.add_argument("--preload", default="numpy,pandas,matplotlib")
    options = parser.parse_args()
    asyncio.run(main(options.blocks, tuple(filter(None, options.preload.split(",")))))
