"""The helpers that run inside the sandbox, next to the model's code: their prompt documentation.

The implementations are in ``app.runtime.library`` (child-side: this module only documents them,
so ``helpers()`` and the prompt builder can show them; the server never runs them). They are
present in every block; the orchestrator passes only ``runs == "service"`` names to the runtime.
``FS.*`` and ``Bash.execute`` are journaled in the child: when a paused block runs again after
its tool results arrive, they return what they returned the first time instead of running again.
"""

from __future__ import annotations

from app.helpers.base import HelperSpec

SPECS: tuple[HelperSpec, ...] = (
    HelperSpec(
        name="FS.read_file",
        signature="FS.read_file(path: str) -> str",
        doc="""
Read a text file of the working directory. Returns its content as a string (UTF-8; bytes that
are not UTF-8 are replaced). `path` is relative to the working directory: absolute paths and
paths that leave it (`..`, symbolic links) raise PermissionError; a missing file raises
FileNotFoundError. Files over 4 MB are refused: read those with pandas or open().
Example:
    code = FS.read_file("src/module.py")
    print(code[:500])
""",
        runs="sandbox",
    ),
    HelperSpec(
        name="FS.write_file",
        signature="FS.write_file(path: str, content: str | bytes) -> str",
        doc="""
Write `content` (a string, or bytes) to a file of the working directory, replacing it if it
exists and creating missing parent directories. Returns the file's path relative to the working
directory. Absolute paths and paths that leave the working directory raise PermissionError.
Example:
    path = FS.write_file("reports/summary.md", "# Summary\\n" + text)
    print(path)  # reports/summary.md
""",
        runs="sandbox",
    ),
    HelperSpec(
        name="FS.list_files",
        signature='FS.list_files(directory: str = ".", pattern: str = "*") -> list[str]',
        doc="""
List the files in `directory` (of the working directory) whose names match the glob `pattern`
(`**` matches subdirectories too, as in `"**/*.py"`). Returns a sorted list of paths relative to
the working directory, ready for FS.read_file; directories are not listed.
Example:
    for path in FS.list_files(".", "**/*.csv"):
        print(path)
""",
        runs="sandbox",
    ),
    HelperSpec(
        name="Bash.execute",
        signature="Bash.execute(command: str, timeout: float = 60) -> str",
        doc="""
Run a shell command (`/bin/sh -c`) in the working directory, inside the sandbox (no network).
Returns what it printed, stdout and stderr together, capped at 100 KB (the middle is cut); when
the command fails, `[exit code N]` is appended. A command still running after `timeout` seconds
is killed and `[timed out after Ns: ...]` appended. It does not raise for a failing command:
check the output.
Example:
    print(Bash.execute("python script.py"))
    output = Bash.execute("pytest tests/ -q", timeout=120)
    if "[exit code" in output:
        print(output[-2000:])
""",
        runs="sandbox",
    ),
    HelperSpec(
        name="pandas_bind",
        signature="pandas_bind(data) -> DataFrame",
        doc="""
Make a pandas DataFrame you can ask questions about. `data` is a DataFrame, a list of dicts
(rows), a dict of columns (or of one record's fields), CSV text, or the path of a CSV file in the
working directory. Returns a DataFrame (everything pandas does works on it) with one more method,
`.ask(question) -> str`: the model answers from a description of the frame (shape, columns and
dtypes, first rows, summary statistics), not from every row, so compute exact numbers with pandas.
The frame is kept between blocks like any variable.
Example:
    df = pandas_bind("sales.csv")
    print(df.groupby("region")["revenue"].sum())
    print(df.ask("Which columns look like they have outliers?"))
""",
        runs="sandbox",
    ),
)
