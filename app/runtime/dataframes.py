"""``pandas_bind`` and the DataFrame it returns (``BoundFrame``), which can answer questions about
itself through the parent's ``llm_call``. Apart from ``library`` so that a worker without pandas in
its preload starts without importing it (~200 ms); a block imports it at its first ``pandas_bind``."""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

import pandas as pd

from app.runtime.library import _confined, _current

_DESCRIPTION_CHARS: Final = 12_000
_ASK_INSTRUCTIONS: Final = (
    "Above is a description of a pandas DataFrame: its shape, columns and dtypes, first rows and "
    "summary statistics. Answer the question below from it; be concise and specific (name columns "
    "and values). If the description is not enough to answer, say what to compute instead.\n"
    "Question: {question}"
)


class BoundFrame(pd.DataFrame):
    """A pandas DataFrame that can answer questions about itself: ``frame.ask("...")``.

    Everything else is the DataFrame's own behaviour (operations return BoundFrames). It is
    saved with the namespace like any DataFrame (by reference to this class) and ``ask`` looks up
    the running block when called, so a frame from an earlier block asks through the current one.
    """

    _metadata: list[str] = []  # noqa: RUF012 -- pandas' own protocol for subclasses

    @property
    def _constructor(self) -> Callable[..., BoundFrame]:
        return BoundFrame

    def ask(self, question: str) -> str:
        """Ask the LLM a question about this frame; returns its answer as a string.

        It gets a compact description (shape, dtypes, first rows, summary statistics), not the
        whole frame: compute exact figures with pandas.
        """
        if not isinstance(question, str) or not question.strip():
            raise ValueError("ask: the question must be a non-empty string")
        answer = _current().call_helper(
            "llm_call", ([describe_frame(self)], _ASK_INSTRUCTIONS.format(question=question.strip())), {}
        )
        return answer if isinstance(answer, str) else str(answer)


def describe_frame(frame: pd.DataFrame, *, max_chars: int = _DESCRIPTION_CHARS) -> str:
    """What ``ask`` tells the LLM about a frame: shape, columns with dtypes, head, describe()."""
    rows, cols = frame.shape
    parts = [f"DataFrame: {rows} rows x {cols} columns"]
    columns = [
        f"  {name!s}: {dtype} ({count} non-null)"
        for (name, dtype), count in zip(frame.dtypes.items(), frame.count().tolist(), strict=True)
    ]
    if len(columns) > 60:
        columns = [*columns[:60], f"  ... and {len(columns) - 60} more columns"]
    parts.append("Columns:\n" + "\n".join(columns))
    with pd.option_context("display.width", 200, "display.max_colwidth", 60, "display.max_columns", 30):
        parts.append("First rows:\n" + frame.head(5).to_string())
        if cols:
            # Some frames cannot be summarised (e.g. only unhashable values): leave it out then.
            with contextlib.suppress(ValueError, TypeError):
                parts.append("Summary statistics:\n" + frame.describe(include="all").to_string())
    text = "\n\n".join(parts)
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... {len(text) - max_chars} characters of description omitted]"
    return text


def pandas_bind(data: Any) -> BoundFrame:
    """A DataFrame (with ``.ask``) from a DataFrame, Series, list of rows/dicts, dict of columns
    (or one record), 2-D array, CSV text, or the path of a CSV/TSV file in the working directory."""
    if isinstance(data, pd.DataFrame):
        return BoundFrame(data.copy())
    if isinstance(data, pd.Series):
        return BoundFrame(data.to_frame())
    if isinstance(data, os.PathLike):
        return _read_csv_file(data)
    if isinstance(data, str):
        if "\n" in data:
            return BoundFrame(pd.read_csv(io.StringIO(data)))
        return _read_csv_file(data)
    if isinstance(data, Mapping):
        if data and not any(_is_column(v) for v in data.values()):
            return BoundFrame([dict(data)])  # one record
        return BoundFrame(dict(data))
    if isinstance(data, list | tuple) or hasattr(data, "__array__"):
        return BoundFrame(list(data) if isinstance(data, tuple) else data)
    raise TypeError(
        f"pandas_bind: cannot make a DataFrame from a {type(data).__name__}; pass a DataFrame, a "
        "list of dicts, a dict of columns, CSV text or the path of a CSV file"
    )


def _is_column(value: object) -> bool:
    """Whether a dict value is a column (a sequence or an array), not one record's field."""
    return isinstance(value, list | tuple | Mapping | pd.Series) or getattr(value, "ndim", 0) > 0


def _read_csv_file(path: str | os.PathLike[str]) -> BoundFrame:
    target = _confined(path, what="pandas_bind")
    if not target.is_file():
        raise FileNotFoundError(
            f"pandas_bind: no file {os.fspath(path)!r} in the working directory (a str without a "
            "newline is read as the path of a CSV file)"
        )
    sep = "\t" if fnmatch.fnmatch(target.name.lower(), "*.tsv") else ","
    return BoundFrame(pd.read_csv(target, sep=sep))
