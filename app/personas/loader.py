"""Load and check persona YAML files: shipped ``personas/`` plus a user directory that overrides them.

Every problem is collected (not just the first) and names the file, the persona and the line, so
``sabre personas check`` can list them all and the service can refuse to start with a message that
says exactly what to fix. Custom-tool implementation files are read with ``ast``, never imported:
persona code does not run in the server.
"""

from __future__ import annotations

import ast
import difflib
import os
import textwrap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog
import yaml
from pydantic import ValidationError

from app.helpers import HELPERS, HelperSpec
from app.personas.models import Persona, PythonRef, parse_implementation

log = structlog.get_logger(__name__)

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "personas"
HELPERS_OPEN = "<helpers>"
HELPERS_CLOSE = "</helpers>"

# Helpers the full helper library (issue 4) adds. A persona may feature them before they exist:
# start-up warns and the prompt leaves them out until they are registered in HELPERS, so a typo
# is still an error while shipped personas can name the library they are written for.
PENDING_HELPERS: frozenset[str] = frozenset()

Severity = Literal["error", "warning"]
Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class PersonaProblem:
    """One thing wrong with a persona file, located as precisely as the file allows."""

    file: Path
    message: str
    line: int | None = None
    persona: str | None = None
    severity: Severity = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else str(self.file)
        who = f" persona {self.persona!r}:" if self.persona else ""
        tag = " warning:" if self.severity == "warning" else ""
        return f"{where}:{tag}{who} {self.message}"


class PersonaError(Exception):
    """Persona files that cannot be used; ``problems`` lists every one, located."""

    def __init__(self, problems: Sequence[PersonaProblem] | str) -> None:
        if isinstance(problems, str):
            problems = [PersonaProblem(file=Path("."), message=problems)]
        self.problems = tuple(problems)
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in persona files:"
        super().__init__("\n".join([head, *(f"  {p}" for p in self.problems)]))


@dataclass(slots=True)
class PersonaCheck:
    """The outcome of checking persona files: the usable personas and every problem found."""

    personas: dict[str, Persona] = field(default_factory=dict)
    problems: list[PersonaProblem] = field(default_factory=list)

    @property
    def errors(self) -> list[PersonaProblem]:
        """Problems that make the files unusable (warnings excluded)."""
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[PersonaProblem]:
        """Problems that do not stop a start (a featured helper that is not available yet)."""
        return [p for p in self.problems if p.severity == "warning"]


# -- locating values in the YAML source ------------------------------------------------------------


class _Located:
    """The composed YAML tree of one file, to turn a data path into a line number."""

    def __init__(self, root: yaml.Node) -> None:
        self.root = root

    def node(self, loc: Loc) -> yaml.Node:
        """The deepest node along ``loc`` (mapping keys by name, sequence items and mapping values by
        index); an unknown key of a mapping resolves to that key's own node when it exists."""
        node = self.root
        for part in loc:
            child = self._child(node, part)
            if child is None:
                break
            node = child
        return node

    @staticmethod
    def _child(node: yaml.Node, part: str | int) -> yaml.Node | None:
        if isinstance(node, yaml.MappingNode):
            pairs: list[tuple[yaml.Node, yaml.Node]] = node.value
            if isinstance(part, int):
                return pairs[part][1] if 0 <= part < len(pairs) else None
            for key, value in pairs:
                if isinstance(key, yaml.ScalarNode) and key.value == part:
                    return value
            return None
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            items: list[yaml.Node] = node.value
            return items[part] if 0 <= part < len(items) else None
        return None

    def key_line(self, loc: Loc) -> int:
        """The line of the mapping key at ``loc`` (an unknown key, a tool written as ``name: {...}``),
        else the line of the deepest value."""
        parent = self.node(loc[:-1])
        if isinstance(parent, yaml.MappingNode) and loc:
            part = loc[-1]
            pairs: list[tuple[yaml.Node, yaml.Node]] = parent.value
            if isinstance(part, int) and 0 <= part < len(pairs):
                return int(pairs[part][0].start_mark.line) + 1
            for key, _ in pairs:
                if isinstance(key, yaml.ScalarNode) and key.value == part:
                    return int(key.start_mark.line) + 1
        return self.line(loc)

    def line(self, loc: Loc) -> int:
        """1-based line where the value at ``loc`` (or its deepest existing parent) starts."""
        return int(self.node(loc).start_mark.line) + 1

    def text_line(self, loc: Loc, offset: int) -> tuple[int, bool]:
        """The file line of line ``offset`` (0-based) inside the string at ``loc``; the flag says
        whether it is exact (literal ``|`` blocks keep lines; folded and quoted strings do not)."""
        node = self.node(loc)
        if isinstance(node, yaml.ScalarNode) and node.style == "|":
            return int(node.start_mark.line) + 2 + offset, True
        return int(node.start_mark.line) + 1, False

    def duplicate_keys(self) -> Iterator[tuple[str, int]]:
        """Keys that appear twice in one mapping (YAML keeps the last one silently)."""
        stack: list[yaml.Node] = [self.root]
        while stack:
            node = stack.pop()
            if isinstance(node, yaml.MappingNode):
                seen: set[str] = set()
                for key, value in node.value:
                    if isinstance(key, yaml.ScalarNode):
                        if key.value in seen:
                            yield key.value, int(key.start_mark.line) + 1
                        seen.add(key.value)
                    stack.append(value)
            elif isinstance(node, yaml.SequenceNode):
                stack.extend(node.value)


def _compose(text: str) -> tuple[yaml.Node | None, Any]:
    """Parse once, keeping both the node tree (for lines) and the data."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    return node, data


# -- the checks ------------------------------------------------------------------------------------


def _loc_text(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _pydantic_message(err: Mapping[str, Any], loc: Loc, *, known: Iterable[str], where: str) -> str:
    """A sentence for one validation error, in the author's vocabulary (``where`` names the value)."""
    kind = err.get("type", "")
    if kind == "missing":
        return f"missing required key {where!r}"
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        close = difflib.get_close_matches(key, list(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        parent = where[: -len(key) - 1] if where.endswith(f".{key}") else ""
        return f"unknown key {key!r}{' in ' + parent if parent else ''}{hint}"
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def _fields_at(loc: Loc) -> Iterable[str]:
    """The keys allowed at ``loc``'s parent, for did-you-mean hints."""
    from app.personas.models import CustomTool, Limits, Network, ToolReturns

    parent = [p for p in loc[:-1] if isinstance(p, str)]
    model: Any = Persona
    for part in parent:
        model = {
            "custom_tools": CustomTool,
            "limits": Limits,
            "network": Network,
            "returns": ToolReturns,
        }.get(part, model)
    return list(model.model_fields)


def _helper_namespaces(helpers: Iterable[str]) -> set[str]:
    return {name.split(".", 1)[0] for name in helpers if "." in name}


def _iter_tools(raw: Any) -> Iterator[tuple[Loc, str | None, Mapping[str, Any]]]:
    """Each raw custom tool with its location, whether written as a list or as a mapping."""
    if isinstance(raw, Mapping):
        for i, (name, spec) in enumerate(raw.items()):
            if isinstance(spec, Mapping):
                yield ("custom_tools", i), str(name), spec
    elif isinstance(raw, list):
        for i, spec in enumerate(raw):
            if isinstance(spec, Mapping):
                name = spec.get("name")
                yield ("custom_tools", i), name if isinstance(name, str) else None, spec


def _iter_examples(raw: Any) -> Iterator[tuple[Loc, str]]:
    if isinstance(raw, str):
        yield ("examples",), raw
    elif isinstance(raw, list):
        for i, example in enumerate(raw):
            if isinstance(example, str):
                yield ("examples", i), example


def helpers_blocks(text: str) -> Iterator[tuple[int, str | None]]:
    """Each ``<helpers>`` block of an example: (0-based line of its code's first line, dedented code),
    with ``None`` as the code of a block that is never closed."""
    pos = 0
    while (start := text.find(HELPERS_OPEN, pos)) >= 0:
        code_start = start + len(HELPERS_OPEN)
        end = text.find(HELPERS_CLOSE, code_start)
        line = text.count("\n", 0, code_start)
        if end < 0:
            yield line, None
            return
        yield line, textwrap.dedent(text[code_start:end])
        pos = end + len(HELPERS_CLOSE)


class _FileChecker:
    """All checks of one persona file; problems accumulate in ``problems``."""

    def __init__(self, path: Path, *, helpers: Mapping[str, HelperSpec]) -> None:
        self.path = path
        self.helpers = helpers
        self.problems: list[PersonaProblem] = []
        self.persona_name: str | None = None
        self.located: _Located | None = None

    def add(self, message: str, *, line: int | None = None, severity: Severity = "error") -> None:
        self.problems.append(
            PersonaProblem(
                file=self.path, message=message, line=line, persona=self.persona_name, severity=severity
            )
        )

    def line(self, loc: Loc) -> int | None:
        return self.located.line(loc) if self.located else None

    def run(self) -> Persona | None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.add(f"cannot read the file: {exc}")
            return None
        try:
            node, raw = _compose(text)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            self.add(f"not valid YAML: {exc.problem or exc}", line=mark.line + 1 if mark else None)
            return None
        if node is None or not isinstance(raw, dict):
            self.add("a persona file must be a YAML mapping (name, identity, examples, ...)", line=1)
            return None
        self.located = _Located(node)
        name = raw.get("name", self.path.stem)
        self.persona_name = str(name)
        for key, line in self.located.duplicate_keys():
            self.add(f"key {key!r} appears twice (YAML keeps only the last one)", line=line)
        if "name" not in raw:
            raw = {"name": self.path.stem, **raw}
        elif name != self.path.stem:
            self.add(
                f"name {name!r} does not match the file name {self.path.name!r} "
                f"(a persona is found, and overridden, by its file name)",
                line=self.located.key_line(("name",)),
            )
        self.check_examples(raw.get("examples"))
        tool_names = self.check_tools(raw.get("custom_tools"))
        self.check_featured(raw.get("featured_helpers"), tool_names=tool_names)
        try:
            persona = Persona.model_validate(raw)
        except ValidationError as exc:
            for err in exc.errors():
                loc = self._raw_loc(tuple(err["loc"]))
                by_key = err["type"] == "extra_forbidden" or (len(loc) == 2 and loc[0] == "custom_tools")
                line = self.located.key_line(loc) if by_key else self.located.line(loc)
                where = self._label(loc, raw.get("custom_tools"))
                self.add(_pydantic_message(err, loc, known=_fields_at(loc), where=where), line=line)
            return None
        if any(p.severity == "error" for p in self.problems):
            return None
        return _absolute_implementations(persona, base=self.path.parent)

    @staticmethod
    def _label(loc: Loc, tools: Any) -> str:
        """``custom_tools[1]`` reads better as the tool's name: ``custom tool 'x'.parameters``."""
        if len(loc) >= 2 and loc[0] == "custom_tools" and isinstance(loc[1], int):
            for tool_loc, name, _ in _iter_tools(tools):
                if tool_loc == loc[:2] and name:
                    rest = _loc_text(loc[2:])
                    return f"custom tool {name!r}" + (
                        f".{rest}" if rest and not rest.startswith("[") else rest
                    )
        return _loc_text(loc)

    def _raw_loc(self, loc: Loc) -> Loc:
        """Pydantic reports union branches and wrappers in ``loc``; keep the path into the data."""
        return tuple(
            p for p in loc if isinstance(p, int) or not (p.startswith(("function-", "tuple[", "dict[")))
        )

    def check_examples(self, raw: Any) -> None:
        """Every ``<helpers>`` block of every example parses as Python (line reported in the file)."""
        assert self.located is not None
        for loc, text in _iter_examples(raw):
            label = _loc_text(loc)
            for first, code in helpers_blocks(text):
                if code is None:
                    line, _ = self.located.text_line(loc, first)
                    self.add(f"{label}: a <helpers> block is never closed with </helpers>", line=line)
                    continue
                try:
                    ast.parse(code)
                except SyntaxError as exc:
                    offset = first + (exc.lineno or 1) - 1
                    line, exact = self.located.text_line(loc, offset)
                    note = "" if exact else f" (line {offset + 1} of the example)"
                    self.add(
                        f"{label}: <helpers> block does not parse: {exc.msg}{note}",
                        line=line,
                    )
            stray = text.count(HELPERS_CLOSE) - text.count(HELPERS_OPEN)
            if stray > 0:
                self.add(f"{label}: </helpers> without a matching <helpers>", line=self.line(loc))

    def check_tools(self, raw: Any) -> set[str]:
        """Tool names that clash with helpers, and implementations that cannot be found."""
        names: set[str] = set()
        taken = set(self.helpers) | PENDING_HELPERS
        namespaces = _helper_namespaces(taken)
        for loc, name, spec in _iter_tools(raw):
            if name is None:
                continue
            names.add(name)
            if name in taken or name in namespaces:
                self.add(
                    f"custom tool {name!r} has the name of a helper; choose another name",
                    line=self.line((*loc, "name")) if "name" in spec else self.located_key(loc),
                )
            impl = spec.get("implementation")
            if isinstance(impl, str):
                self.check_implementation(impl, spec, loc=(*loc, "implementation"))
        return names

    def located_key(self, loc: Loc) -> int | None:
        return self.located.key_line(loc) if self.located else None

    def check_implementation(self, impl: str, spec: Mapping[str, Any], *, loc: Loc) -> None:
        """A ``file.py::function`` implementation exists and defines the function (read, not run)."""
        try:
            ref = parse_implementation(impl)
        except ValueError:
            return  # the model's validator reports the malformed string
        if not isinstance(ref, PythonRef):
            return
        line = self.line(loc)
        file = resolve_python_path(ref.path, base=self.path.parent)
        if not file.is_file():
            self.add(f"implementation file {str(file)!r} does not exist", line=line)
            return
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        except SyntaxError as exc:
            self.add(f"implementation file {file}:{exc.lineno} does not parse: {exc.msg}", line=line)
            return
        except (OSError, UnicodeDecodeError) as exc:
            self.add(f"cannot read implementation file {str(file)!r}: {exc}", line=line)
            return
        found = _find_definition(tree, ref.function)
        if found is None:
            self.add(f"{file.name} does not define a function {ref.function!r} at top level", line=line)
            return
        params = spec.get("parameters")
        if isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef) and isinstance(params, Mapping):
            for message in _signature_mismatches(found, params):
                self.add(f"{file.name}::{ref.function}: {message}", line=line)

    def check_featured(self, raw: Any, *, tool_names: set[str]) -> None:
        """Each featured helper exists (``*`` means all), is a custom tool, or is a pending helper."""
        if not isinstance(raw, list):
            return
        known = sorted(set(self.helpers) | tool_names | PENDING_HELPERS)
        for i, entry in enumerate(raw):
            if not isinstance(entry, str) or entry == "*" or entry in self.helpers or entry in tool_names:
                continue
            line = self.line(("featured_helpers", i))
            if entry in PENDING_HELPERS:
                self.add(
                    f"featured helper {entry!r} is not available in this build; it is left out of the "
                    f"prompt until it is",
                    line=line,
                    severity="warning",
                )
                continue
            close = difflib.get_close_matches(entry, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self.add(f"featured_helpers[{i}]: no helper or custom tool named {entry!r}{hint}", line=line)


def resolve_python_path(path: str, *, base: Path) -> Path:
    """An implementation file: ``~`` and ``$VARS`` expanded, relative paths against ``base`` (the
    directory of the persona file that names it)."""
    file = Path(os.path.expandvars(os.path.expanduser(path)))
    return file if file.is_absolute() else (base / file).resolve()


def _absolute_implementations(persona: Persona, *, base: Path) -> Persona:
    """The persona with every ``file.py::function`` made absolute, so whoever loads the tool later
    does not need to know where the persona file was."""
    tools = []
    changed = False
    for tool in persona.custom_tools:
        ref = tool.ref
        if isinstance(ref, PythonRef):
            absolute = f"{resolve_python_path(ref.path, base=base)}::{ref.function}"
            changed = changed or absolute != tool.implementation
            tool = tool.model_copy(update={"implementation": absolute})
        tools.append(tool)
    return persona.model_copy(update={"custom_tools": tuple(tools)}) if changed else persona


def _find_definition(tree: ast.Module, name: str) -> ast.stmt | None:
    """The top-level ``def``/``async def``/assignment that binds ``name``, if any."""
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == name:
            return stmt
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in stmt.targets
        ):
            return stmt
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
            return stmt
    return None


def _signature_mismatches(fn: ast.FunctionDef | ast.AsyncFunctionDef, schema: Mapping[str, Any]) -> list[str]:
    """Arguments the schema declares that the function cannot take, and the reverse."""
    args = fn.args
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    problems = [
        f"argument {a.arg!r} is positional-only; the tool is called with its arguments by name"
        for a in args.posonlyargs
    ]
    if args.kwarg is None:
        problems += [
            f"the schema's parameter {p!r} is not an argument of the function"
            for p in props
            if p not in named
        ]
    positional = [*args.posonlyargs, *args.args]
    no_default = [a.arg for a in positional[: len(positional) - len(args.defaults)]]
    no_default += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    required = set(schema.get("required") or ())
    for arg in no_default:
        if arg not in props:
            problems.append(f"argument {arg!r} has no default and is not in the schema's properties")
        elif arg not in required:
            problems.append(f"argument {arg!r} has no default, so the schema must list it as required")
    return problems


# -- directories -----------------------------------------------------------------------------------


def _persona_files(directories: Iterable[Path], check: PersonaCheck) -> dict[str, Path]:
    """``*.yaml``/``*.yml`` files by persona (file) name; a later directory overrides an earlier one."""
    files: dict[str, Path] = {}
    for directory in directories:
        if directory.is_file():
            files[directory.stem] = directory
            continue
        if not directory.is_dir():
            check.problems.append(PersonaProblem(file=directory, message="persona directory does not exist"))
            continue
        here: dict[str, Path] = {}
        for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
            if path.stem in here:
                check.problems.append(
                    PersonaProblem(
                        file=path, message=f"two files define persona {path.stem!r}: {here[path.stem].name}"
                    )
                )
                continue
            here[path.stem] = path
        files.update(here)
    return files


def check_personas(
    *paths: Path, helpers: Mapping[str, HelperSpec] = HELPERS, require_default: bool = True
) -> PersonaCheck:
    """Check persona files in ``paths`` (directories or files; later ones override earlier ones by
    file name) and return the usable personas with every problem found."""
    check = PersonaCheck()
    for stem, path in sorted(_persona_files(paths or (SHIPPED_DIR,), check).items()):
        checker = _FileChecker(path, helpers=helpers)
        persona = checker.run()
        check.problems.extend(sorted(checker.problems, key=lambda p: p.line or 0))
        if persona is not None:
            check.personas[stem] = persona
    if require_default and "default" not in check.personas and not check.errors:
        where = ", ".join(str(p) for p in paths or (SHIPPED_DIR,))
        check.problems.append(PersonaProblem(file=Path(where), message="the 'default' persona is missing"))
    return check


def load_persona_file(path: Path, *, helpers: Mapping[str, HelperSpec] = HELPERS) -> Persona:
    """Parse and check one persona file; ``PersonaError`` lists its problems."""
    check = check_personas(path, helpers=helpers, require_default=False)
    if check.errors:
        raise PersonaError(check.errors)
    return check.personas[path.stem]


def load_personas(*paths: Path, helpers: Mapping[str, HelperSpec] = HELPERS) -> dict[str, Persona]:
    """Every persona of ``paths`` (default: the shipped directory), by name; later paths override
    earlier ones by file name. Raises ``PersonaError`` listing every problem; logs the warnings."""
    check = check_personas(*paths, helpers=helpers)
    if check.errors:
        raise PersonaError(check.errors)
    if check.warnings:
        log.warning("persona_warnings", problems=[str(w) for w in check.warnings])
    return check.personas
