"""The sandbox's own helpers (FS, Bash, pandas_bind), dotted parent helpers, their journal, figures."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from app.runtime import CallReply, HelperCall, JournalEntry, Limits, RuntimePool
from app.runtime.protocol import MAX_JOURNAL_BYTES, PNG_SIGNATURE
from tests.runtime.support import Recorder, run

pytestmark = pytest.mark.asyncio(loop_scope="package")


def suspend_external(call: HelperCall) -> CallReply:
    """Pause on external tools; answer internal helpers with their name and first argument."""
    if call.runs == "caller":
        return CallReply(kind="suspend")
    return CallReply(kind="value", value=f"{call.name}:{call.args[0] if call.args else ''}")


# -- dotted parent helpers -------------------------------------------------------------------


async def test_dotted_helpers_are_methods_of_a_group(pool: RuntimePool, tmp_path: Path) -> None:
    recorder = Recorder(suspend_external)
    helpers = ["llm_call", "Search.search", "Web.get", "Web.download_csv"]
    first = await run(
        pool,
        "hits = Search.search('sabre', num_results=2)\n"
        "page = Web.get('https://example.com')\n"
        "result(hits)\nresult(page)\nresult(repr(Web))\n"
        "web = Web\nfetch = Web.get\nfs = FS\nread = FS.read_file\nbind = pandas_bind\n",
        workdir=tmp_path,
        helpers=helpers,
        on_call=recorder,
    )
    assert first.status == "ok", first.error
    assert first.results == [
        "Search.search:sabre",
        "Web.get:https://example.com",
        "<helpers Web: download_csv, get>",
    ]
    assert [(c.name, c.runs, c.kwargs) for c in recorder.calls] == [
        ("Search.search", "service", {"num_results": 2}),
        ("Web.get", "service", {}),
    ]
    assert [e.name for e in first.journal] == ["Search.search", "Web.get"]
    # A variable holding a group or a bound helper is saved by name, bound to the next block's.
    assert first.dropped == []
    second = await run(
        pool,
        "result(web.download_csv('u'))\nresult(fetch('v'))\n"
        "fs.write_file('a.txt', 'x')\nresult(read('a.txt'))\nresult(type(bind({'a': [1]})).__name__)\n"
        "try:\n    Web.nothing\nexcept AttributeError as exc:\n    result(str(exc))\n",
        workdir=tmp_path,
        helpers=helpers,
        snapshot=first.snapshot,
        on_call=Recorder(suspend_external),
    )
    assert second.status == "ok", second.error
    assert second.results == [
        "Web.download_csv:u",
        "Web.get:v",
        "x",
        "BoundFrame",
        "Web has no helper 'nothing' (it has: download_csv, get)",
    ]


async def test_helper_names_are_checked(pool: RuntimePool, tmp_path: Path) -> None:
    refused: list[tuple[list[str], dict[str, list[str]]]] = [
        (["Search.__class__"], {}),
        (["A.b.c"], {}),
        (["A.class"], {}),
        (["Search", "Search.search"], {}),
        (["FS.read_file"], {}),
        (["pandas_bind"], {}),
        (["FS"], {}),
        ([], {"Bash": []}),
        (["result.x"], {}),
    ]
    for helpers, tools in refused:
        with pytest.raises(ValueError, match=r"helper or tool|reserved|both"):
            await run(pool, "pass", workdir=tmp_path, helpers=helpers, tools=tools)
    # A parent helper may join a sandbox group.
    outcome = await run(
        pool,
        "result(FS.upload('x'))\nresult(sorted(dir(FS)))\n",
        workdir=tmp_path,
        helpers=["FS.upload"],
        on_call=Recorder(suspend_external),
    )
    assert outcome.results == [
        "FS.upload:x",
        '["list_files", "read_file", "upload", "write_file"]',
    ]


# -- FS ----------------------------------------------------------------------------------------


async def test_fs_reads_writes_and_lists_in_the_workdir(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "result(FS.write_file('notes/a.txt', 'héllo\\n'))\n"
        "result(FS.write_file('b.csv', b'x,y\\n1,2\\n'))\n"
        "result(FS.read_file('notes/a.txt'))\n"
        "result(FS.list_files())\n"
        "result(FS.list_files('.', '**/*.txt'))\n"
        "result(FS.list_files('notes'))\n",
        workdir=tmp_path,
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.results == [
        "notes/a.txt",
        "b.csv",
        "héllo\n",
        '["b.csv"]',
        '["notes/a.txt"]',
        '["notes/a.txt"]',
    ]
    assert (tmp_path / "notes" / "a.txt").read_text() == "héllo\n"
    assert [e.name for e in outcome.journal] == ["FS.write_file"] * 2 + ["FS.read_file"] + [
        "FS.list_files"
    ] * 3


async def test_fs_is_confined_to_the_workdir(
    pool: RuntimePool, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text("secret")
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "link").symlink_to(outside)
    (workdir / "secret_link.txt").symlink_to(outside / "secret.txt")
    attempts = [
        "FS.read_file('../outside_file')",
        f"FS.read_file({str(outside / 'secret.txt')!r})",
        "FS.read_file('link/secret.txt')",
        "FS.read_file('secret_link.txt')",
        "FS.read_file('a/../../x')",
        "FS.write_file('link/new.txt', 'x')",
        "FS.write_file('/tmp/new.txt', 'x')",
        "FS.write_file('../new.txt', 'x')",
        "FS.list_files('link')",
        "FS.list_files('..')",
        "FS.list_files('.', '../*')",
    ]
    code = "".join(
        f"try:\n    {attempt}\n    result('allowed')\n"
        f"except PermissionError as exc:\n    result(type(exc).__name__)\n"
        for attempt in attempts
    )
    code += "result(FS.list_files())\n"
    outcome = await run(pool, code, workdir=workdir)
    assert outcome.status == "ok", outcome.error
    assert outcome.results == ["PermissionError"] * len(attempts) + ["[]"]  # links out are not listed
    assert not (outside / "new.txt").exists()
    assert not (tmp_path / "new.txt").exists()


async def test_fs_errors_are_plain_exceptions(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "try:\n    FS.read_file('missing.txt')\nexcept FileNotFoundError as exc:\n    result(str(exc))\n"
        "FS.write_file('x.txt', {'a': 1})\n",
        workdir=tmp_path,
    )
    assert outcome.results == ["FS.read_file: no file 'missing.txt' in the working directory"]
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.startswith("Traceback (line 5): TypeError: FS.write_file: content must be str")


# -- Bash ----------------------------------------------------------------------------------------


async def test_bash_returns_output_and_exit_code(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(
        pool,
        "import os\nresult(Bash.execute('echo out; echo err >&2; pwd') == f'out\\nerr\\n{os.getcwd()}\\n')\n"
        "result(Bash.execute('echo failing; exit 3'))\n"
        "result(Bash.execute('printf no-newline; exit 1'))\n"
        "result(Bash.execute('sleep 5', timeout=0.3))\n"
        "result(Bash.execute('sleep 30 & echo started'))\n"
        "result(Bash.execute('echo closing; exec >&- 2>&-; sleep 5', timeout=0.3))\n"
        "out = Bash.execute('yes abcdefgh | head -c 300000')\n"
        "result(len(out))\nresult('bytes truncated]' in out)\n"
        "endless = Bash.execute('yes', timeout=0.3)\n"
        "result(endless.endswith('[timed out after 0.3s: the command was killed]'))\n"
        "result(len(endless) < 101_000)\n",
        workdir=tmp_path,
        limits=Limits(wall_clock_seconds=10),
    )
    assert outcome.status == "ok", outcome.error
    assert outcome.results[:6] == [
        "True",  # stdout and stderr, run in the working directory
        "failing\n[exit code 3]",
        "no-newline\n[exit code 1]",
        "[timed out after 0.3s: the command was killed]",
        "started\n",  # the background job does not hold the call up
        "closing\n[timed out after 0.3s: the command was killed]",
    ]
    assert int(outcome.results[6]) < 101_000
    assert outcome.results[7:] == ["True", "True", "True"]
    assert outcome.duration_ms < 5_000


# -- pandas_bind ---------------------------------------------------------------------------------


async def test_pandas_bind_survives_the_snapshot_and_asks_through_llm_call(
    pool: RuntimePool, tmp_path: Path
) -> None:
    (tmp_path / "sales.csv").write_text("month,revenue\nJan,100\nFeb,120\nMar,90\n")
    first = await run(
        pool,
        "df = pandas_bind([{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'y'}])\n"
        "doubled = df.assign(c=df['a'] * 2)\n"
        "sales = pandas_bind('sales.csv')\n"
        "inline = pandas_bind('k,v\\n1,2\\n')\n"
        "record = pandas_bind({'k': 1, 'v': 'z'})\n"
        "columns = pandas_bind({'k': [1, 2]})\n"
        "result([type(x).__name__ for x in (df, doubled, sales, inline, record, columns)])\n"
        "result([x.shape for x in (df, sales, inline, record, columns)])\n",
        workdir=tmp_path,
        helpers=["llm_call"],
    )
    assert first.status == "ok", first.error
    assert first.results == [
        '["BoundFrame", "BoundFrame", "BoundFrame", "BoundFrame", "BoundFrame", "BoundFrame"]',
        "[[2, 2], [3, 2], [1, 2], [1, 2], [2, 1]]",
    ]
    assert first.dropped == []
    recorder = Recorder(lambda call: CallReply(kind="value", value="Revenue peaks in February."))
    second = await run(
        pool,
        "import pandas as pd\n"
        "result(isinstance(sales, pd.DataFrame))\nresult(int(doubled['c'].sum()))\n"
        "result(sales.ask('Which month has the highest revenue?'))\n",
        workdir=tmp_path,
        helpers=["llm_call"],
        snapshot=first.snapshot,
        on_call=recorder,
    )
    assert second.status == "ok", second.error
    assert second.results == ["True", "6", "Revenue peaks in February."]
    [call] = recorder.calls
    assert call.name == "llm_call"
    assert call.runs == "service"
    [description], instructions = call.args
    assert description.startswith("DataFrame: 3 rows x 2 columns")
    assert "revenue: int64 (3 non-null)" in description
    assert "Feb" in description
    assert "Question: Which month has the highest revenue?" in instructions
    assert call.line == 4
    assert [e.name for e in second.journal] == ["llm_call"]


async def test_ask_without_llm_call_is_a_clear_error(pool: RuntimePool, tmp_path: Path) -> None:
    outcome = await run(pool, "pandas_bind({'a': [1]}).ask('why?')\n", workdir=tmp_path)
    assert outcome.status == "error"
    assert outcome.error is not None
    assert "NameError: the llm_call helper is not available in this block" in outcome.error


# -- durable replay of sandbox helpers -----------------------------------------------------------

REPLAYED = (
    "out = Bash.execute('echo line >> log.txt; wc -l < log.txt')\n"
    "path = FS.write_file('state.txt', 'written')\n"
    "try:\n    FS.read_file('missing.txt')\nexcept FileNotFoundError:\n    missing = True\n"
    "user = find_user('sarah')\n"
    "result(out.strip())\nresult(path)\nresult(missing)\nresult(user)\n"
)


async def test_sandbox_helpers_are_not_run_again_on_replay(pool: RuntimePool, tmp_path: Path) -> None:
    tools = {"find_user": ["name"]}
    first = await run(pool, REPLAYED, workdir=tmp_path, tools=tools, on_call=Recorder(suspend_external))
    assert first.status == "suspended"
    assert first.pending is not None
    assert [e.name for e in first.journal] == ["Bash.execute", "FS.write_file", "FS.read_file"]
    assert first.journal[2].error_type == "FileNotFoundError"
    assert (tmp_path / "log.txt").read_text() == "line\n"

    journal = [*first.journal, JournalEntry.for_call(first.pending, CallReply(kind="value", value="u1"))]
    recorder = Recorder(suspend_external)
    second = await run(pool, REPLAYED, workdir=tmp_path, tools=tools, journal=journal, on_call=recorder)
    assert second.status == "ok", second.error
    assert second.results == ["1", "state.txt", "True", "u1"]
    assert second.journal == journal
    assert recorder.calls == []
    # The command ran once: the file has ONE line.
    assert (tmp_path / "log.txt").read_text() == "line\n"


async def test_a_changed_sandbox_call_on_replay_is_a_divergence(pool: RuntimePool, tmp_path: Path) -> None:
    tools = {"find_user": ["name"]}
    code = "Bash.execute('echo a >> log.txt')\nfind_user('x')\n"
    first = await run(pool, code, workdir=tmp_path, tools=tools, on_call=Recorder(suspend_external))
    assert first.pending is not None
    journal = [*first.journal, JournalEntry.for_call(first.pending, CallReply(kind="value", value=1))]
    changed = code.replace("echo a", "echo b")
    outcome = await run(pool, changed, workdir=tmp_path, tools=tools, journal=journal)
    assert outcome.status == "error"
    assert outcome.error is not None
    assert outcome.error.startswith(
        'ReplayDivergenceError: call #1 of the block is Bash.execute("echo b >> log.txt") at line 1'
    )
    assert (tmp_path / "log.txt").read_text() == "a\n"


# -- figures -------------------------------------------------------------------------------------


async def test_open_figures_are_captured_as_png(pool: RuntimePool, tmp_path: Path) -> None:
    first = await run(
        pool,
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\nax.plot([1, 3, 2])\n"
        "plt.figure()\nplt.bar(['a', 'b'], [1, 2])\n",
        workdir=tmp_path,
    )
    assert first.status == "ok", first.error
    assert len(first.figures) == 2
    assert all(image.startswith(PNG_SIGNATURE) for image in first.figures)
    assert first.dropped == []
    # Captured figures are closed: the next block starts with none (and keeps `fig`).
    second = await run(
        pool,
        "result(plt.get_fignums())\nresult(type(fig).__name__)\n",
        workdir=tmp_path,
        snapshot=first.snapshot,
    )
    assert second.results == ["[]", "Figure"]
    assert second.figures == []


async def test_no_figures_without_pyplot_or_on_suspend(pool: RuntimePool, tmp_path: Path) -> None:
    plain = await run(pool, "x = 1\n", workdir=tmp_path)
    assert plain.figures == []
    suspended = await run(
        pool,
        "import matplotlib.pyplot as plt\nplt.plot([1])\nlookup()\n",
        workdir=tmp_path,
        tools={"lookup": []},
        on_call=Recorder(suspend_external),
    )
    assert suspended.status == "suspended"
    assert suspended.figures == []


async def test_pandas_is_imported_at_the_first_pandas_bind_without_a_preload(
    replaying_pool: RuntimePool, tmp_path: Path
) -> None:
    """A worker without pandas in its preload starts without it (~200 ms less); a block that
    binds a frame imports it then, and the frame survives the snapshot."""
    first = await run(
        replaying_pool,
        "import sys\nresult('pandas' in sys.modules)\ndf = pandas_bind({'a': [1, 2]})\n"
        "result(type(df).__name__)\nresult('pandas' in sys.modules)\n",
        workdir=tmp_path,
    )
    assert first.status == "ok", first.error
    assert first.results == ["False", "BoundFrame", "True"]
    second = await run(
        replaying_pool, "result(int(df['a'].sum()))\n", workdir=tmp_path, snapshot=first.snapshot
    )
    assert second.status == "ok", second.error
    assert second.results == ["3"]


async def test_a_frame_saved_under_its_old_module_still_loads() -> None:
    """Snapshots from before ``BoundFrame`` moved to ``dataframes`` name it in ``library``."""
    from app.runtime import dataframes

    saved = pickle.dumps(dataframes.BoundFrame({"a": [1, 2]}), protocol=0)
    assert b"capp.runtime.dataframes\nBoundFrame\n" in saved
    old = saved.replace(b"capp.runtime.dataframes\nBoundFrame\n", b"capp.runtime.library\nBoundFrame\n")
    loaded = pickle.loads(old)
    assert type(loaded) is dataframes.BoundFrame
    assert loaded["a"].tolist() == [1, 2]


async def test_a_replayed_journal_leaves_the_rest_of_the_cap_to_records(
    pool: RuntimePool, tmp_path: Path
) -> None:
    """The child counts the journal it replays before the block's own records: a block resumed many
    times used to add up to MAX_JOURNAL_BYTES of records in every run. Past what is left, a
    sandbox helper raises in the code (the worker and the server count the same way)."""
    code = (
        "first = find_user('a')\n"
        "FS.write_file('data.txt', 'y' * 200_000)\n"
        "try:\n    FS.read_file('data.txt')\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
        "print(len(first))"
    )
    tools = {"find_user": ["name"]}
    paused = await run(pool, code, workdir=tmp_path, tools=tools, on_call=Recorder(suspend_external))
    assert paused.status == "suspended"
    assert paused.pending is not None
    answer = CallReply(kind="value", value="x" * (MAX_JOURNAL_BYTES - 150_000))
    journal = [JournalEntry.for_call(paused.pending, answer)]
    # Replayed by a fresh process (the paused one waits, bound to ``tmp_path``).
    (tmp_path / "replay").mkdir()
    resumed = await run(
        pool, code, workdir=tmp_path / "replay", tools=tools, journal=journal, on_call=suspend_external
    )
    assert resumed.process == "fresh"
    assert resumed.status == "ok", resumed.error
    assert "ValueError this block's journal is full" in resumed.stdout
    assert resumed.stdout.endswith(f"{MAX_JOURNAL_BYTES - 150_000}\n")
    assert [entry.name for entry in resumed.journal] == ["find_user", "FS.write_file", "FS.read_file"]
    assert resumed.journal[2].error_type == "ValueError"
