"""The sandbox runtime's costs, next to the references of DESIGN.md §5 and §9.

Prints one table: block-start latency (``run_block()`` called -> the block's first line running,
from a ``time.perf_counter()`` the code prints; the clock is system-wide), the whole round trip,
blocks per second for a trivial block with two workers, a resume after 1 and after 100 earlier
external calls, idle worker memory, CPU per block (server, workers and their children together), the
same for the next block of a conversation whose process is live (``live_seconds``: no fork, no
snapshot restore), alone and with two conversations at once, a new conversation's block from a
snapshot in a process readied for it (``RuntimePool.prepare``) against a fresh one, and two references: a cold
``python -c pass`` and the same trivial block run by ``exec()`` in-process (no isolation at all).
Latencies are measured with the pool idle (each block finds a forked child waiting), as a
request arriving at a server would.

Run: ``uv run python bench/runtime_bench.py [--workers 2] [--blocks 300] [--preload numpy,pandas]
[--sandbox auto|bwrap|process]`` (the default preload is the pool's: numpy, pandas, matplotlib;
``--preload ''`` for none; the default sandbox is ``auto``, as in the service).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from app.runtime import BlockOutcome, CallReply, HelperCall, JournalEntry, Limits, RuntimePool
from app.runtime.isolation import SandboxMode

# Like a service's data directory, not under /tmp (a bwrap block gets a /tmp of its own).
_DATA_PARENT = "/var/tmp" if os.path.isdir("/var/tmp") else None
TRIVIAL = "print(__import__('time').perf_counter())"
RESUME = "total = 0\nfor i in range({n}):\n    total += add_one(i)\nprint(total)\n"


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def suspend(call: HelperCall) -> CallReply:
    return CallReply(kind="suspend")


class Bench:
    def __init__(self, pool: RuntimePool, workdir: Path, size: int) -> None:
        self.pool = pool
        self.workdir = workdir
        self.size = size
        self.limits = Limits()

    async def run(
        self,
        code: str,
        *,
        snapshot: bytes | None = None,
        tools: dict[str, list[str]] | None = None,
        journal: Sequence[JournalEntry] = (),
    ) -> BlockOutcome:
        return await self.pool.run_block(
            code=code,
            snapshot=snapshot,
            workdir=self.workdir,
            limits=self.limits,
            internal_helpers=(),
            external_tools=tools or {},
            journal=journal,
            on_call=suspend,
        )

    async def until_idle(self) -> None:
        """Wait until every worker has a child ready (a block then never waits for a fork)."""
        for _ in range(10_000):
            if self.pool.idle_workers >= self.size:
                return
            await asyncio.sleep(0.002)
        raise RuntimeError("the pool did not get back to idle")

    async def start_latency(self, rounds: int, snapshot: bytes | None) -> tuple[list[float], list[float]]:
        starts, totals = [], []
        for _ in range(rounds):
            await self.until_idle()
            began = time.perf_counter()
            outcome = await self.run(TRIVIAL, snapshot=snapshot)
            totals.append(time.perf_counter() - began)
            starts.append(float(outcome.stdout) - began)
        return starts, totals

    async def throughput(self, blocks: int) -> float:
        gate = asyncio.Semaphore(2 * self.size)

        async def one() -> None:
            async with gate:
                await self.run("x = 1")

        began = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(blocks)))
        return blocks / (time.perf_counter() - began)

    async def journal_for(self, calls: int) -> list[JournalEntry]:
        """The journal of the resume block after ``calls`` answered calls, built the way a
        conversation builds it: one pause, one answer, one resume at a time."""
        code, tools = RESUME.format(n=calls), {"add_one": ["x"]}
        journal: list[JournalEntry] = []
        while True:
            outcome = await self.run(code, tools=tools, journal=journal)
            if outcome.status != "suspended":
                assert outcome.status == "ok", outcome.error
                return journal
            assert outcome.pending is not None
            answer = CallReply(kind="value", value=outcome.pending.arguments["x"] + 1)
            journal = [*outcome.journal, JournalEntry.for_call(outcome.pending, answer)]

    async def resume_costs(self, rounds: int) -> tuple[float, float]:
        """p50 of a resume that replays 1 and 100 answered calls, measured alternately (so
        both see the same machine load)."""
        journals = {n: await self.journal_for(n) for n in (1, 100)}
        times: dict[int, list[float]] = {1: [], 100: []}
        for _ in range(rounds):
            for n, journal in journals.items():
                await self.until_idle()
                began = time.perf_counter()
                await self.run(RESUME.format(n=n), tools={"add_one": ["x"]}, journal=journal)
                times[n].append(time.perf_counter() - began)
        return statistics.median(times[1]), statistics.median(times[100])


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU seconds used by ``root`` and every process below it, reaped children included."""
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / _CLOCK_TICKS
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    stack += [int(c) for c in children.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


async def cpu_per_block(bench: Bench, blocks: int) -> float:
    """CPU seconds per trivial block, fresh fork each (a new conversation's first block)."""
    before = tree_cpu(os.getpid())
    for _ in range(blocks):
        await bench.run("x = 1")
    return (tree_cpu(os.getpid()) - before) / blocks


async def live_costs(
    preload: Sequence[str], sandbox: SandboxMode, workspaces: Path, blocks: int
) -> dict[str, float]:
    """Follow-up blocks in live processes: start latency and round trip of the next block of a
    conversation (its snapshot is the one its process left), sequential blocks/s and CPU per
    block on one conversation, and blocks/s with two conversations at once (three workers: two
    processes stay bound, one stays free)."""
    async with RuntimePool(
        size=3, preload=preload, sandbox=sandbox, workspaces=workspaces, live_seconds=60.0
    ) as pool:
        conversations = [workspaces / f"live-{i}" for i in range(2)]
        for path in conversations:
            path.mkdir()
        snapshots: dict[Path, bytes | None] = dict.fromkeys(conversations)

        async def block(path: Path, code: str = "x = 1") -> BlockOutcome:
            outcome = await pool.run_block(
                code=code,
                snapshot=snapshots[path],
                workdir=path,
                limits=Limits(),
                internal_helpers=(),
                external_tools={},
                journal=(),
                on_call=suspend,
            )
            assert outcome.status == "ok", outcome.error
            if outcome.snapshot is not None:
                snapshots[path] = outcome.snapshot
            return outcome

        first = conversations[0]
        await block(first, "import numpy as np\nrows = list(range(1000))\n")
        starts, totals = [], []
        for _ in range(300):
            began = time.perf_counter()
            outcome = await block(first, TRIVIAL)
            totals.append(time.perf_counter() - began)
            starts.append(float(outcome.stdout) - began)
        cpu_before = tree_cpu(os.getpid())
        began = time.perf_counter()
        for _ in range(blocks):
            await block(first)
        sequential = blocks / (time.perf_counter() - began)
        cpu = (tree_cpu(os.getpid()) - cpu_before) / blocks

        async def chain(path: Path) -> None:
            for _ in range(blocks):
                await block(path)

        await block(conversations[1])
        began = time.perf_counter()
        await asyncio.gather(*(chain(path) for path in conversations))
        parallel = 2 * blocks / (time.perf_counter() - began)
        assert pool.live_processes == 2
    return {
        "start": pct(starts, 0.5),
        "start_p95": pct(starts, 0.95),
        "total": pct(totals, 0.5),
        "sequential": sequential,
        "parallel": parallel,
        "cpu": cpu,
    }


def _snapshot_code(preload: Sequence[str]) -> str:
    """A block whose namespace makes the snapshot rows' snapshot (a DataFrame when pandas is
    preloaded)."""
    if {"numpy", "pandas"} <= set(preload):
        return (
            "import numpy as np\nimport pandas as pd\n"
            "df = pd.DataFrame({'a': range(1000), 'b': ['x'] * 1000})\n"
            "def f(x):\n    return x + 1\n"
        )
    return "x = list(range(1000))\ndef f(x):\n    return x + 1\n"


async def prepared_costs(
    preload: Sequence[str], sandbox: SandboxMode, workspaces: Path, snapshot_code: str, rounds: int
) -> dict[str, float]:
    """A new conversation's block from a snapshot, fresh or in a process readied for it
    (``RuntimePool.prepare``, which the service starts when the model's answer opens a block): with
    time to get ready (a model writing the code), and overtaken by the block (a model that
    answers at once), then the block waits for the readying and costs a round trip more. p50 of
    ``rounds`` each, interleaved; the pool idle before each."""
    async with RuntimePool(
        size=2, preload=preload, sandbox=sandbox, workspaces=workspaces, live_seconds=60.0, live_processes=8
    ) as pool:
        source = workspaces / "prepared-source"
        source.mkdir()
        bench = Bench(pool, source, 2)
        data = await bench.run(snapshot_code)
        assert data.status == "ok", data.error
        assert data.snapshot is not None
        times: dict[str, list[tuple[float, float]]] = {"fresh": [], "ready": [], "overtaken": []}
        for i in range(rounds):
            for mode, runs in times.items():
                bench.workdir = workspaces / f"prepared-{mode}-{i}"
                bench.workdir.mkdir()
                await bench.until_idle()
                if mode != "fresh":
                    pool.prepare(
                        snapshot=data.snapshot,
                        workdir=bench.workdir,
                        limits=bench.limits,
                        internal_helpers=(),
                        external_tools={},
                    )
                    for _ in range(10_000):  # "ready": until the readied process is bound
                        if mode != "ready" or pool.bindings.holds(bench.workdir):
                            break
                        await asyncio.sleep(0.001)
                    await bench.until_idle()
                began = time.perf_counter()
                outcome = await bench.run(TRIVIAL, snapshot=data.snapshot)
                expected = "fresh" if mode == "fresh" else "prepared"
                assert outcome.process == expected, (mode, outcome.process)
                runs.append((float(outcome.stdout) - began, time.perf_counter() - began))
    return {
        f"{mode} {what}": pct([run[index] for run in runs], 0.5)
        for mode, runs in times.items()
        for index, what in enumerate(("start", "total"))
    }


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                continue
    return found


def _kib(path: str, *fields: str) -> int:
    total = 0
    with open(path) as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in fields:
                total += int(value.split()[0])
    return total


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read()
    except OSError:
        return b""


def _workers(pid: int) -> list[int]:
    """The worker processes below ``pid`` (under bwrap they sit below bubblewrap's processes)."""
    found = []
    for child in _children(pid):
        if b"app.runtime.worker" in _cmdline(child) and b"bwrap" not in _cmdline(child).split(b"\0")[0]:
            found.append(child)
        else:
            found += _workers(child)
    return found


def memory() -> tuple[float, float, float]:
    """MiB: the RSS of the zygote (the process that imported the preloads), and the private
    memory of each worker it forked and of each worker's idle child, averaged."""
    zygotes = _workers(os.getpid())
    workers = [w for z in zygotes for w in _children(z)]
    children = [c for w in workers for c in _children(w)]

    def private(pids: list[int]) -> float:
        sizes = [_kib(f"/proc/{p}/smaps_rollup", "Private_Clean", "Private_Dirty") / 1024 for p in pids]
        return statistics.mean(sizes) if sizes else 0.0

    rss = [_kib(f"/proc/{z}/status", "VmRSS") / 1024 for z in zygotes]
    return statistics.mean(rss), private(workers), private(children)


def cold_spawn(rounds: int = 20) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def in_process(rounds: int = 2000) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        namespace: dict[str, object] = {}
        exec(compile("x = 1", "<helpers>", "exec"), namespace)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


async def main(workers: int, blocks: int, preload: Sequence[str], sandbox: SandboxMode) -> None:
    with tempfile.TemporaryDirectory(dir=_DATA_PARENT) as tmp:
        workspaces = Path(tmp)
        (workspaces / "conversation").mkdir()
        began = time.perf_counter()
        async with RuntimePool(size=workers, preload=preload, sandbox=sandbox, workspaces=workspaces) as pool:
            startup = time.perf_counter() - began
            bench = Bench(pool, workspaces / "conversation", workers)
            data = await bench.run(_snapshot_code(preload))
            await bench.start_latency(20, None)  # warm the parent's code paths
            starts, totals = await bench.start_latency(200, None)
            snap_starts, snap_totals = await bench.start_latency(100, data.snapshot)
            rate = await bench.throughput(blocks)
            fresh_cpu = await cpu_per_block(bench, min(blocks, 200))
            await bench.until_idle()
            rss, worker_private, child_private = memory()
            resume_1, resume_100 = await bench.resume_costs(40)
        live = await live_costs(preload, sandbox, workspaces, blocks)
        prepared = await prepared_costs(preload, sandbox, workspaces, _snapshot_code(preload), 60)
    spawn = cold_spawn()
    exec_time = in_process()

    ms = 1e3
    rows = [
        (
            "pool start (workers ready)",
            f"{startup * ms:.0f} ms",
            f"{workers} workers, preload {','.join(preload) or '-'}, sandbox {pool.sandbox}",
        ),
        (
            "block start p50 / p95",
            f"{pct(starts, 0.5) * ms:.3f} / {pct(starts, 0.95) * ms:.3f} ms",
            "budget <= 0.5 ms p50",
        ),
        (
            "block round trip p50 / p95",
            f"{pct(totals, 0.5) * ms:.3f} / {pct(totals, 0.95) * ms:.3f} ms",
            "trivial block, no snapshot",
        ),
        (
            "  with a snapshot: start p50",
            f"{pct(snap_starts, 0.5) * ms:.3f} ms",
            f"{len(data.snapshot or b'') / 1024:.0f} KiB namespace restored",
        ),
        (
            "  with a snapshot: round trip p50",
            f"{pct(snap_totals, 0.5) * ms:.3f} ms",
            "restore + run + snapshot again",
        ),
        (
            "  readied ahead: start p50 / round trip p50",
            f"{prepared['ready start'] * ms:.3f} / {prepared['ready total'] * ms:.3f} ms",
            f"prepare() done before the block (fresh here: {prepared['fresh total'] * ms:.3f} ms)",
        ),
        (
            "  readying overtaken: round trip p50",
            f"{prepared['overtaken total'] * ms:.3f} ms",
            "the block came right after prepare(): it waits, one round trip more",
        ),
        ("blocks/s (trivial block)", f"{rate:.0f}", f"{workers} workers, {2 * workers} in flight"),
        ("resume after 1 call, p50", f"{resume_1 * ms:.3f} ms", "the block replays 1 answered call"),
        (
            "resume after 100 calls, p50",
            f"{resume_100 * ms:.3f} ms",
            f"ratio {resume_100 / resume_1:.2f} (budget <= 2)",
        ),
        ("zygote RSS", f"{rss:.1f} MiB", "imports the preloads once; every worker is a fork of it"),
        (
            "idle worker, private",
            f"{worker_private + child_private:.1f} MiB",
            f"{worker_private:.1f} MiB the worker + {child_private:.1f} MiB its idle child "
            "(budget <= 100 MiB)",
        ),
        ("CPU per block, fresh fork", f"{fresh_cpu * ms:.2f} ms", "server + workers + children"),
        (
            "live: next block start p50 / p95",
            f"{live['start'] * ms:.3f} / {live['start_p95'] * ms:.3f} ms",
            "its conversation's process is live (no fork, no restore)",
        ),
        ("live: next block round trip p50", f"{live['total'] * ms:.3f} ms", "budget <= 0.3 ms"),
        ("live: blocks/s, one conversation", f"{live['sequential']:.0f}", "one block after another"),
        ("live: blocks/s, two conversations", f"{live['parallel']:.0f}", "budget >= 2,000 on two cores"),
        ("live: CPU per block", f"{live['cpu'] * ms:.2f} ms", "server + workers + children"),
        ("cold `python -c pass`", f"{spawn * ms:.1f} ms", "reference: a spawn per block would cost this"),
        ("in-process exec() of a block", f"{exec_time * ms:.3f} ms", "reference: no isolation at all"),
    ]
    width = max(len(r[0]) for r in rows)
    value_width = max(len(r[1]) for r in rows)
    print(f"{'metric':<{width}}  {'value':>{value_width}}  note")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>{value_width}}  {note}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=300)
    parser.add_argument("--preload", default="numpy,pandas,matplotlib")
    parser.add_argument("--sandbox", choices=("auto", "bwrap", "process"), default="auto")
    options = parser.parse_args()
    preload = [m for m in options.preload.split(",") if m]
    asyncio.run(main(options.workers, options.blocks, preload, options.sandbox))
