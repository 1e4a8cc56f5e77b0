"""SWE-bench instances in (a JSON list or JSON Lines), predictions out (SWE-bench's own format)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

INSTANCE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,199}$"
"""SWE-bench ids look like ``django__django-11099``; the id names a directory, so no slashes."""


class InstanceError(ValueError):
    """The instances file cannot be used (unreadable, malformed, or an instance is invalid)."""


class Instance(BaseModel):
    """One SWE-bench task: the repository at a commit and the issue to resolve there."""

    model_config = ConfigDict(extra="ignore")

    instance_id: str = Field(pattern=INSTANCE_ID_PATTERN)
    repo: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._\-]+(/[A-Za-z0-9._\-]+)?$")
    base_commit: str = Field(pattern=r"^[0-9a-fA-F]{7,64}$")
    problem_statement: str = Field(min_length=1, max_length=200_000)


class Prediction(BaseModel):
    """One line of ``predictions.jsonl``, what ``swebench.harness.run_evaluation`` reads."""

    instance_id: str
    model_name_or_path: str
    model_patch: str


def load_instances(path: Path) -> list[Instance]:
    """Read instances from a JSON list (or one object) or JSON Lines; refuse duplicates."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InstanceError(f"{path}: cannot read: {exc}") from None
    stripped = text.lstrip()
    records: list[object]
    if stripped.startswith("["):
        try:
            loaded = json.loads(text)
        except ValueError as exc:
            raise InstanceError(f"{path}: not valid JSON: {exc}") from None
        records = list(loaded)
    else:
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                raise InstanceError(f"{path}:{number}: not valid JSON: {exc}") from None
    instances: list[Instance] = []
    seen: set[str] = set()
    for index, record in enumerate(records, start=1):
        try:
            instance = Instance.model_validate(record)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "record"
            raise InstanceError(f"{path}: instance {index}: {where}: {first['msg']}") from None
        if instance.instance_id in seen:
            raise InstanceError(f"{path}: instance {instance.instance_id} appears twice")
        seen.add(instance.instance_id)
        instances.append(instance)
    return instances


def finished_ids(predictions: Path) -> set[str]:
    """The instance ids ``predictions.jsonl`` already holds (a torn last line is ignored)."""
    if not predictions.exists():
        return set()
    done: set[str] = set()
    for line in predictions.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("instance_id"), str):
            done.add(record["instance_id"])
    return done


def append_jsonl(path: Path, records: Iterable[BaseModel]) -> None:
    """Append records as JSON lines, each written whole and flushed (a crash loses at most one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torn = False
    if path.exists() and path.stat().st_size > 0:
        with path.open("rb") as existing:
            existing.seek(-1, 2)
            torn = existing.read(1) != b"\n"
    with path.open("a", encoding="utf-8") as out:
        if torn:  # a previous run died mid-line: start on a line of our own
            out.write("\n")
        for record in records:
            out.write(record.model_dump_json() + "\n")
            out.flush()
