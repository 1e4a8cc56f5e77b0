"""The SWE-bench runner's tools and input files, under the hostile input a model or a file gives."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from sabre_swebench.instances import InstanceError, Prediction, append_jsonl, finished_ids, load_instances
from sabre_swebench.tools import Toolbox, ToolFailure, ToolLimits

SOURCE = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"


@pytest.fixture
def box(tmp_path: Path) -> Toolbox:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "calc.py").write_text(SOURCE)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    return Toolbox(root, limits=ToolLimits(timeout=5, output_bytes=10_000))


def edit(box: Toolbox, **arguments: Any) -> str:
    return asyncio.run(box.run("str_replace_editor", arguments))


def test_view_numbers_lines_and_honours_a_range(box: Toolbox) -> None:
    whole = edit(box, command="view", path="pkg/calc.py")
    assert whole.splitlines()[1] == "     2\t    return a - b"
    assert edit(box, command="view", path="pkg/calc.py", view_range=[5, -1]).splitlines()[0] == (
        "     5\tdef sub(a, b):"
    )
    listing = edit(box, command="view", path=".")
    assert "pkg/" in listing.splitlines()
    assert "pkg/calc.py" in listing.splitlines()
    assert ".git" not in listing
    with pytest.raises(ToolFailure, match="first line 99"):
        edit(box, command="view", path="pkg/calc.py", view_range=[99, 100])


def test_str_replace_needs_exactly_one_occurrence(box: Toolbox) -> None:
    with pytest.raises(ToolFailure, match=r"occurs 2 times .*lines 2, 6"):
        edit(box, command="str_replace", path="pkg/calc.py", old_str="return a - b", new_str="x")
    with pytest.raises(ToolFailure, match="did not appear verbatim"):
        edit(box, command="str_replace", path="pkg/calc.py", old_str="return  a - b", new_str="x")
    assert (box.root / "pkg" / "calc.py").read_text() == SOURCE  # a failed edit changes nothing
    shown = edit(
        box,
        command="str_replace",
        path="pkg/calc.py",
        old_str="def add(a, b):\n    return a - b",
        new_str="def add(a, b):\n    return a + b",
    )
    assert "     2\t    return a + b" in shown
    assert edit(box, command="undo_edit", path="pkg/calc.py").startswith("reverted")
    assert (box.root / "pkg" / "calc.py").read_text() == SOURCE
    with pytest.raises(ToolFailure, match="no edit to undo"):
        edit(box, command="undo_edit", path="pkg/calc.py")


def test_insert_and_create(box: Toolbox) -> None:
    edit(box, command="insert", path="pkg/calc.py", insert_line=0, new_str="import math")
    assert (box.root / "pkg" / "calc.py").read_text().startswith("import math\ndef add")
    with pytest.raises(ToolFailure, match="insert_line 99"):
        edit(box, command="insert", path="pkg/calc.py", insert_line=99, new_str="x")
    edit(box, command="create", path="pkg/new/mod.py", file_text="X = 1\n")
    assert (box.root / "pkg" / "new" / "mod.py").read_text() == "X = 1\n"
    with pytest.raises(ToolFailure, match="already exists"):
        edit(box, command="create", path="pkg/new/mod.py", file_text="X = 2\n")


@pytest.mark.parametrize(
    "path",
    [
        "../outside.py",
        "/etc/passwd",
        "pkg/../../outside.py",
        "link/escape.py",
        ".git/config",
        "pkg/../.git/x",
    ],
)
def test_paths_stay_in_the_checkout(box: Toolbox, path: str) -> None:
    (box.root / "link").symlink_to(box.root.parent)
    with pytest.raises(ToolFailure, match=r"outside the repository|does not touch \.git"):
        edit(box, command="create", path=path, file_text="pwned")
    assert not (box.root.parent / "outside.py").exists()
    assert not (box.root.parent / "escape.py").exists()


def test_bad_arguments_and_unreadable_files_are_clean_errors(box: Toolbox) -> None:
    (box.root / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ToolFailure, match="not a UTF-8 text file"):
        edit(box, command="str_replace", path="blob.bin", old_str="a", new_str="b")
    with pytest.raises(ToolFailure, match="command"):
        edit(box, command="delete", path="pkg/calc.py")
    with pytest.raises(ToolFailure, match="sneaky: Extra inputs"):
        edit(box, command="view", path="pkg/calc.py", sneaky=1)
    with pytest.raises(ToolFailure, match="no such file"):
        edit(box, command="view", path="nope.py")
    with pytest.raises(ToolFailure, match="unknown tool"):
        asyncio.run(box.run("rm_rf", {}))


def test_bash_caps_output_keeps_both_ends_and_reports_failure(box: Toolbox) -> None:
    out = asyncio.run(box.bash("echo first; head -c 300000 /dev/zero | tr '\\0' x; echo; echo last; exit 3"))
    assert out.startswith("first\nxxx")
    assert "bytes of output cut; 300,0" in out
    assert out.rstrip().endswith("last\n\n[exit code 3]".rstrip())
    assert len(out) < 11_000


def test_bash_timeout_kills_the_whole_group(box: Toolbox) -> None:
    box.limits = ToolLimits(timeout=0.5, output_bytes=10_000)
    began = time.perf_counter()
    out = asyncio.run(box.bash("(sleep 30; touch late) & sleep 30; echo never"))
    assert time.perf_counter() - began < 5
    assert "[timed out after 0.5 s" in out
    assert "never" not in out
    time.sleep(0.2)
    assert not (box.root / "late").exists()


def test_bash_runs_in_the_checkout_without_the_runners_secrets(
    box: Toolbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SABRE_API_KEY", "sk-very-secret")
    out = asyncio.run(box.bash("pwd; env"))
    assert out.splitlines()[0] == str(box.root)
    assert "sk-very-secret" not in out
    assert os.environ["SABRE_API_KEY"] == "sk-very-secret"


def instance(**fields: Any) -> dict[str, Any]:
    return {
        "instance_id": "acme__calc-1",
        "repo": "acme/calc",
        "base_commit": "a" * 40,
        "problem_statement": "add() subtracts",
        **fields,
    }


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (instance(instance_id="../../etc"), "instance_id"),
        (instance(base_commit="HEAD; rm -rf /"), "base_commit"),
        (instance(repo="acme/calc/../../x"), "repo"),
        ({"instance_id": "x"}, "repo"),
        ("not an object", "record"),
    ],
)
def test_bad_instances_are_refused_with_their_place(tmp_path: Path, record: Any, message: str) -> None:
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(instance()) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(InstanceError, match=rf"instance 2: .*{message}"):
        load_instances(path)


def test_instance_files_json_or_jsonl_duplicates_and_garbage(tmp_path: Path) -> None:
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([instance(), instance(instance_id="b-2", extra_field=[1])]))
    assert [i.instance_id for i in load_instances(listed)] == ["acme__calc-1", "b-2"]
    twice = tmp_path / "twice.jsonl"
    twice.write_text(json.dumps(instance()) + "\n\n" + json.dumps(instance()) + "\n")
    with pytest.raises(InstanceError, match="appears twice"):
        load_instances(twice)
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text(json.dumps(instance()) + "\n{torn")
    with pytest.raises(InstanceError, match=r"garbage.jsonl:2: not valid JSON"):
        load_instances(garbage)


def test_a_torn_predictions_line_is_ignored_and_not_glued_to(tmp_path: Path) -> None:
    path = tmp_path / "predictions.jsonl"
    path.write_text(
        '{"instance_id": "a", "model_name_or_path": "s", "model_patch": ""}\n{"instance_id": "b", "mo'
    )
    assert finished_ids(path) == {"a"}
    append_jsonl(path, [Prediction(instance_id="c", model_name_or_path="s", model_patch="diff")])
    assert finished_ids(path) == {"a", "c"}


def test_sabre_swe_is_the_runners_command_line() -> None:
    from typer.testing import CliRunner

    from app.cli import cli

    shown = CliRunner().invoke(cli, ["swe", "--help"])
    assert shown.exit_code == 0
    assert "predictions.jsonl" in shown.output
    assert "--repos" in shown.output
    refused = CliRunner().invoke(cli, ["swe", "instances.jsonl"])  # neither --repo nor --repos
    assert refused.exit_code == 2
