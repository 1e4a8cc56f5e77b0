"""Where a sandboxed block's CPU goes: the fork itself, and each process of the sandbox.

Prints two tables (markdown):

1. ``fork()`` + ``_exit()`` of a process holding the preloaded modules (numpy, pandas, matplotlib by
   default) and of one holding only the runtime: the kernel's page-table copy and teardown, which
   every fresh block pays once (and which only a smaller heap makes cheaper).
2. CPU per trivial block by process (the server's own, bubblewrap, the zygote, the workers, the
   blocks' processes), for a fresh fork (a new conversation's first block) and for the next block
   of a conversation whose process is live, under each sandbox that runs here (``bwrap``,
   ``process``): which side of the relay to make cheaper.
3. Where in each process the CPU of fresh blocks goes (``perf record -g``, sampled with kernel
   stacks, when ``perf`` is installed and allowed): the fork's page-table copy, page faults
   (copy-on-write or not), exit, namespaces and mounts, other system calls, and the interpreter.

CPU comes from /proc (user + system, reaped children included), so it counts the kernel's work.
Run: ``uv run python bench/fork_bench.py [--blocks 300] [--preload numpy,pandas,matplotlib]``.
Nothing is asserted: the machines are noisy, compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from app.runtime import RuntimePool
from app.runtime.backend import bwrap_problem
from app.runtime.isolation import SandboxMode, find_bwrap
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


def roles_below(server: int) -> dict[int, str]:
    """The role of ``server`` and of each process below it now (a worker's block: ``blocks``)."""
    roles = {server: "server"}

    def walk(pid: int, parent_role: str) -> None:
        for child in _children(pid):
            try:
                command = _command(child)
            except (FileNotFoundError, ProcessLookupError):
                continue
            if b"bwrap" in command.split(b"\0")[0]:
                role = "bwrap"
            elif b"--zygote" in command and parent_role in ("server", "bwrap"):
                role = "zygote"
            elif parent_role == "zygote":
                role = "workers"
            elif parent_role in ("workers", "blocks"):
                role = "blocks"
            else:
                role = parent_role
            roles[child] = role
            walk(child, role)

    walk(server, "server")
    return roles


def cpu_by_role(server: int) -> dict[str, float]:
    """CPU seconds so far of each kind of process below (and including) ``server``."""
    totals = dict.fromkeys(ROLES, 0.0)
    for pid, role in roles_below(server).items():
        try:
            own, reaped = _stat(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
        totals[role] += own
        if role in ("workers", "blocks"):  # the workers reap their blocks' processes
            totals["blocks"] += reaped
    return totals


async def cpu_per_block(
    sandbox: SandboxMode, preload: Sequence[str], *, blocks: int, live: bool
) -> dict[str, float]:
    """CPU ms per trivial block by role: each a new conversation's first block (``live=False``),
    or the next block of one conversation whose process stays live."""
    with tempfile.TemporaryDirectory(prefix="sabre-fork-bench-", dir="/var/tmp") as tmp:
        return await _cpu_per_block(sandbox, preload, Path(tmp), blocks=blocks, live=live)


async def _cpu_per_block(
    sandbox: SandboxMode, preload: Sequence[str], workspaces: Path, *, blocks: int, live: bool
) -> dict[str, float]:
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


# Kernel functions that say what a sample was doing, first match wins (the rest: "syscalls" when a
# system call is on the stack, else "interpreter": user space, Python and its libraries).
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fork: page tables", ("dup_mmap", "copy_process")),
    ("exit", ("exit_mmap", "do_exit")),
    ("copy-on-write faults", ("do_wp_page", "wp_page_copy")),
    ("other page faults", ("exc_page_fault",)),
    ("namespaces, mounts", ("ksys_unshare", "path_mount", "__x64_sys_mount", "__x64_sys_setns")),
    ("syscalls", ("do_syscall_64",)),
)
OTHER = "interpreter"


async def perf_breakdown(
    sandbox: SandboxMode, preload: Sequence[str], *, blocks: int
) -> dict[tuple[str, str], float] | None:
    """Shares of the CPU samples of fresh blocks by (role, category), or None without ``perf``."""
    perf = shutil.which("perf")
    if perf is None:
        return None
    workspaces = Path(tempfile.mkdtemp(prefix="sabre-fork-bench-", dir="/var/tmp"))
    data = workspaces / "perf.data"
    async with RuntimePool(size=2, preload=preload, sandbox=sandbox, workspaces=workspaces) as pool:
        workdir = workspaces / "conversation"
        workdir.mkdir()
        bench = Bench(pool, workdir, 2)
        for _ in range(20):
            await bench.run("x = 1")
        await bench.until_idle()
        roles = roles_below(os.getpid())
        # -p follows what the sampled processes fork from now on (the blocks' processes).
        argv = [perf, "record", "-q", "-g", "-F", "999", "-o", str(data), "-p", ",".join(map(str, roles))]
        recorder = await asyncio.create_subprocess_exec(
            *argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        await asyncio.sleep(1.0)
        for _ in range(blocks):
            await bench.until_idle()
            await bench.run("x = 1")
        recorder.send_signal(signal.SIGINT)
        await asyncio.wait_for(recorder.wait(), timeout=30)
    script = await asyncio.create_subprocess_exec(
        perf, "script", "-i", str(data), "-F", "pid,ip,sym", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    output = (await script.communicate())[0].decode(errors="replace")
    shutil.rmtree(workspaces, ignore_errors=True)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for sample in output.split("\n\n"):
        lines = sample.strip().splitlines()
        if not lines or not lines[0].strip().isdigit():
            continue
        stack = " ".join(lines[1:])
        category = next((name for name, marks in CATEGORIES if any(m in stack for m in marks)), OTHER)
        counts[roles.get(int(lines[0]), "blocks"), category] += 1
    total = sum(counts.values())
    return {key: n / total for key, n in counts.items()} if total else None


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
    shares = await perf_breakdown(sandboxes[0], preload, blocks=blocks)
    if shares is None:
        print(
            "(3. skipped: no `perf` here, or it recorded nothing: it needs perf_event_paranoid <= 1 or root)"
        )
        return
    fresh = rows[0]  # the first sandbox's fresh blocks: CPU ms per block by role, then the total
    per_block = float(fresh[-1])
    columns = [name for name, _ in CATEGORIES] + [OTHER]
    table(
        f"3. Where a fresh block's CPU goes under {sandboxes[0]} (perf samples, as CPU ms per block "
        f"of the {per_block:.2f} ms of table 2)",
        ["process", *columns, "all"],
        [
            [
                role,
                *(f"{shares.get((role, c), 0.0) * per_block:.2f}" for c in columns),
                f"{sum(shares.get((role, c), 0.0) for c in columns) * per_block:.2f}",
            ]
            for role in ROLES
            if any(shares.get((role, c)) for c in columns)
        ],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--blocks", type=int, default=300)
    parser.add_argument("--preload", default="numpy,pandas,matplotlib")
    options = parser.parse_args()
    asyncio.run(main(options.blocks, tuple(filter(None, options.preload.split(",")))))
