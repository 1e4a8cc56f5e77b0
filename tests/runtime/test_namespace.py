"""Output, results, errors and the namespace that persists from block to block."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from app.runtime import Limits, RuntimePool
from tests.runtime.support import run

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_print_and_result(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "print('hello', 1 + 1)\nresult('text')\nresult({'a': [1, 2]})\nresult(3.5)\n",
        workdir=tmp_path,
    )
    assert outcome.status == "ok"
    assert outcome.stdout == "hello 2\n"
    assert outcome.results == ["text", '{"a": [1, 2]}', "3.5"]
    assert outcome.error is None
    assert outcome.snapshot is not None
    assert outcome.duration_ms > 0


async def test_variables_persist_through_the_snapshot(pool: RuntimePool, tmp_path: Path) -> None:
    first = await run(pool, "x = 41\nnames = ['a']\n", workdir=tmp_path)
    second = await run(
        pool,
        "x += 1\nnames.append('b')\nresult(x)\nresult(names)\n",
        workdir=tmp_path,
        snapshot=first.snapshot,
    )
    assert second.results == ["42", '["a", "b"]']


async def test_dataframe_persists(pool: RuntimePool, tmp_path: Path) -> None:
    first = await run(
        pool,
        "import pandas as pd\ndf = pd.DataFrame({'a': range(1000), 'b': ['x'] * 1000})\n",
        workdir=tmp_path,
    )
    second = await run(
        pool,
        "result(int(df['a'].sum()))\nresult(df.shape)\n",
        workdir=tmp_path,
        snapshot=first.snapshot,
    )
    assert second.results == ["499500", "[1000, 2]"]


async def test_imports_persist_as_modules(pool: RuntimePool, tmp_path: Path) -> None:
    first = await run(pool, "import numpy as np\nimport json\nfrom os import path\n", workdir=tmp_path)
    second = await run(
        pool,
        "result(np.arange(4).sum().item())\nresult(json.dumps([1]))\nresult(path.join('a', 'b'))",
        workdir=tmp_path,
        snapshot=first.snapshot,
    )
    assert second.status == "ok", second.error
    assert second.results == ["6", "[1]", "a/b"]


async def test_functions_and_shared_references_stay_live(pool: RuntimePool, tmp_path: Path) -> None:
    """A function sees the namespace as it is now; aliases stay aliases (as in a REPL)."""
    first = await run(
        pool,
        "counter = 1\n"
        "def get():\n    return counter\n"
        "data = {'rows': [1]}\nrows = data['rows']\n"
        "class Point:\n    def __init__(self, v):\n        self.v = v\n"
        "    def double(self):\n        return self.v * 2\n"
        "p = Point(3)\n",
        workdir=tmp_path,
    )
    second = await run(
        pool,
        "counter = 5\nrows.append(2)\n"
        "result(get())\nresult(data['rows'])\nresult(p.double())\nresult(isinstance(p, Point))\n",
        workdir=tmp_path,
        snapshot=first.snapshot,
    )
    assert second.status == "ok", second.error
    assert second.results == ["5", "[1, 2]", "6", "True"]


async def test_unpicklable_values_are_dropped_and_named(pool: RuntimePool, tmp_path: Path) -> None:
    first = await run(
        pool,
        "import threading\nlock = threading.Lock()\ngen = (i for i in range(3))\nkeep = 42\n"
        "result(next(gen))\n",
        workdir=tmp_path,
    )
    assert first.status == "ok"
    assert first.results == ["0"]
    assert first.dropped == ["lock", "gen"]
    second = await run(
        pool,
        "result(keep)\nresult('gen' in globals())\n",
        workdir=tmp_path,
        snapshot=first.snapshot,
    )
    assert second.results == ["42", "False"]
    assert second.dropped == []


async def test_error_has_a_line_numbered_traceback_and_keeps_earlier_assignments(
    pool: RuntimePool, tmp_path: Path
) -> None:
    first = await run(pool, "x = 1\ny = 1/0\nz = 3\n", workdir=tmp_path)
    assert first.status == "error"
    assert first.error == ("Traceback (line 2): ZeroDivisionError: division by zero\n  line 2: y = 1/0")
    assert first.snapshot is not None
    second = await run(
        pool, "result(x)\nresult('z' in globals())\n", workdir=tmp_path, snapshot=first.snapshot
    )
    assert second.results == ["1", "False"]


async def test_traceback_shows_only_block_frames(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "import json\n\ndef parse(text):\n    return json.loads(text)\n\nvalue = parse('{')\n",
        workdir=tmp_path,
    )
    assert outcome.error is not None
    lines = outcome.error.splitlines()
    assert lines[0].startswith("Traceback (line 4): JSONDecodeError: Expecting property name")
    assert lines[1:] == ["  line 6: value = parse('{')", "  line 4 in parse: return json.loads(text)"]


async def test_syntax_error(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(pool, "x = 1\ny = = 2\n", workdir=tmp_path)
    assert outcome.status == "error"
    assert outcome.error == "Traceback (line 2): SyntaxError: invalid syntax\n  line 2: y = = 2"


async def test_snapshot_over_the_limit(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "print('made it')\nx = 'a' * 100_000\n",
        workdir=tmp_path,
        limits=Limits(snapshot_bytes=10_000),
    )
    assert outcome.status == "limit"
    assert outcome.limit == "snapshot_size 0.01MB"
    assert outcome.snapshot is None
    assert outcome.stdout == "made it\n"


async def test_subprocess_and_fd_output_is_captured(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "import os, subprocess, sys\nprint('before', flush=True)\n"
        "os.write(1, b'raw\\n')\n"
        "subprocess.run(['echo', 'from a subprocess'], check=True)\n"
        "sys.__stderr__.write('buffered\\n')\n",
        workdir=tmp_path,
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.stdout == "before\nraw\nfrom a subprocess\nbuffered\n"


async def test_stdout_of_100_mb_is_capped(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(pool, "for i in range(100):\n    print(str(i % 10) * 1_000_000)\n", workdir=tmp_path)
    assert outcome.status == "ok"
    head, marker, tail = outcome.stdout.partition("\n[... ")
    assert len(head) == 16_000
    assert head == "0" * 16_000
    assert marker
    # 100 lines of 1,000,001 bytes, of which 32,000 are kept.
    assert tail.startswith(f"{100 * 1_000_001 - 32_000} bytes truncated]\n")
    assert tail.endswith("9" * 15_999 + "\n")


async def test_exit_ends_the_block(pool: RuntimePool, tmp_path: Path) -> None:
    quiet = await run(pool, "print('a')\nexit()\nprint('b')\n", workdir=tmp_path)
    assert (quiet.status, quiet.stdout) == ("ok", "a\n")
    failing = await run(pool, "import sys\nsys.exit(3)\n", workdir=tmp_path)
    assert failing.status == "error"
    assert failing.error == "Traceback (line 2): SystemExit: 3\n  line 2: sys.exit(3)"


async def test_stdin_is_empty(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(pool, "try:\n    input()\nexcept EOFError:\n    result('eof')\n", workdir=tmp_path)
    assert outcome.results == ["eof"]


async def test_results_are_capped(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "for i in range(10_000):\n    result('x' * 10)\n",
        workdir=tmp_path,
        limits=Limits(stdout_bytes=1_000),
    )
    assert outcome.results[:100] == ["x" * 10] * 100
    assert outcome.results[100:] == ["[... 9900 more results truncated]"]


async def test_traceback_through_a_function_of_an_earlier_block(pool: RuntimePool, tmp_path: Path) -> None:
    first = await run(pool, "def ratio(a, b):\n    return a / b\n", workdir=tmp_path)
    second = await run(pool, "x = 1\nratio(x, 0)\n", workdir=tmp_path, snapshot=first.snapshot)
    assert second.error == (
        "Traceback (line 2): ZeroDivisionError: division by zero\n"
        "  line 2: ratio(x, 0)\n"
        "  line 2 in ratio (a function from an earlier block)"
    )


async def test_a_tool_error_saved_under_its_old_module_still_loads() -> None:
    """Snapshots from before the child's code moved to ``app.runtime.child`` name a caught
    ``ToolError`` in ``app.runtime.sandbox``."""
    from app.runtime.child.namespace import ToolError

    saved = pickle.dumps(ToolError("no such order", "NotFound"), protocol=0)
    assert b"capp.runtime.child.namespace\nToolError\n" in saved
    old = saved.replace(b"capp.runtime.child.namespace\nToolError\n", b"capp.runtime.sandbox\nToolError\n")
    loaded = pickle.loads(old)
    assert type(loaded) is ToolError
    assert str(loaded) == "no such order"
