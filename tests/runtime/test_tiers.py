"""``TierRule``: which blocks need the preloaded workers (the pool's use of it runs end to end in
test_plain_workers.py)."""

from __future__ import annotations

import pytest

from app.runtime.tiers import SCAN_BYTES, TierRule

RULE = TierRule(("numpy", "pandas", "matplotlib.pyplot"))


@pytest.mark.parametrize(
    "code",
    [
        "import numpy\nresult(numpy.ones(3).sum())",
        "import numpy as n\n",
        "from pandas import DataFrame",
        "x = np.arange(3)",  # the alias, imported by an earlier block
        "df = pd.read_csv('a.csv')",
        "frame = pandas_bind(rows)",  # the runtime's helper that returns a pandas frame
        "import matplotlib.pyplot as plt",
        "plt.plot([1, 2])",
        "m = importlib.import_module('pandas')",  # a module named in a string is named all the same
    ],
)
def test_code_that_names_a_preloaded_module_runs_on_preloaded_workers(code: str) -> None:
    assert RULE.tier(code, snapshot=b"") == "preloaded"


@pytest.mark.parametrize(
    "code",
    [
        "print(1 + 1)",
        "rows = get_orders(customer='c1')\nresult(len(rows))",
        "numpyish = 1\nmy_np = 2\npandas_like = 3\nplotting = 4",  # words that only contain a name
    ],
)
def test_code_that_names_none_runs_on_plain_workers(code: str) -> None:
    assert RULE.tier(code, snapshot=b"") == "plain"


def test_a_snapshot_that_refers_to_a_preloaded_module_keeps_its_conversation_on_them() -> None:
    """A namespace holding an array or a frame is unpickled with its module: restoring it on a
    plain worker would import it there, at every fresh block of that conversation."""
    assert RULE.tier("print(total)", snapshot=b"\x80\x05...numpy.core.multiarray...") == "preloaded"
    assert RULE.tier("print(total)", snapshot=b"\x80\x05...builtins...") == "plain"


def test_a_snapshot_too_large_to_search_keeps_its_conversation_on_them() -> None:
    """Searching a 50 MB snapshot would hold the server's event loop ~60 ms before each fresh
    block: past SCAN_BYTES the conversation runs where every conversation ran before."""
    assert RULE.tier("print(total)", snapshot=b"\0" * SCAN_BYTES) == "plain"
    assert RULE.tier("print(total)", snapshot=b"\0" * (SCAN_BYTES + 1)) == "preloaded"


def test_a_sandbox_tool_that_names_one_runs_on_preloaded_workers() -> None:
    """A persona's sandbox tool runs in the block's process: its source counts as the code's."""
    source = "import pandas\ndef summarize(path):\n    return pandas.read_csv(path).describe().to_dict()\n"
    assert RULE.tier("summarize('a.csv')", snapshot=b"", sources=[source]) == "preloaded"
    assert RULE.tier("summarize('a.csv')", snapshot=b"", sources=["def summarize(p):\n    return p\n"]) == (
        "plain"
    )


def test_any_preloaded_module_counts_by_its_top_level_name() -> None:
    rule = TierRule(("colorsys", "xml.dom.minidom"))
    assert rule.tier("import colorsys", snapshot=b"") == "preloaded"
    assert rule.tier("from xml.etree import ElementTree", snapshot=b"") == "preloaded"
    assert rule.tier("import json", snapshot=b"") == "plain"


def test_without_preloads_every_block_is_plain() -> None:
    assert TierRule(()).tier("import numpy", snapshot=b"numpy") == "plain"
