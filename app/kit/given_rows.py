"""Rows given to PostgreSQL as one array per column (``unnest``), so that a batch is one INSERT
(not one per row, as an executemany is on the server) and can go into a statement that stores more
(a data-modifying CTE). The JSON column travels as text and is cast back: reading one JSON document
into columns would unescape every string in it, and a NUL that a block printed (a ``\\u0000``
escape, which a ``json`` column keeps) fails that."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, Select, Table, Text, bindparam, func, select
from sqlalchemy import cast as cast_
from sqlalchemy.dialects.postgresql import ARRAY


def given_rows(table: Table, *, prefix: str, json_column: str) -> Select[Any]:
    """``SELECT`` of the rows bound as ``<prefix>_<column>`` arrays (``row_arrays``), every column
    of ``table`` in its order, for ``insert(table).from_select(...)``."""
    columns = [column.name for column in table.columns]
    given = (
        func.unnest(
            *(
                bindparam(
                    f"{prefix}_{name}", type_=ARRAY(Text if name == json_column else table.c[name].type)
                )
                for name in columns
            )
        )
        .table_valued(*columns)
        .render_derived(name=f"given_{prefix}")
    )
    return select(*(cast_(given.c[name], JSON) if name == json_column else given.c[name] for name in columns))


def row_arrays(
    rows: Sequence[dict[str, Any]], table: Table, *, prefix: str, json_column: str
) -> dict[str, list[Any]]:
    """The parameters of ``given_rows``: one list per column of ``table`` (the JSON column as text)."""
    return {
        f"{prefix}_{column.name}": [
            json.dumps(row[column.name]) if column.name == json_column else row[column.name] for row in rows
        ]
        for column in table.columns
    }
