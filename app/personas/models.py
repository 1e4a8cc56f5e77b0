"""The persona file format (YAML), validated strictly so a broken persona fails at start-up.

A persona is an identity, example workflows, the helpers it documents in full, and custom tools.
These models check everything a file can get wrong on its own (unknown keys, a blank identity, a
tool whose name is not a Python identifier or whose parameters are not a JSON Schema). Checks that
need the outside world (the helper registry, implementation files, line numbers) live in the loader.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.personas.tooldoc import render_tool
from app.runtime.schemas import Runner
from app.tools.schema import compile_schema

ExecutionMode = Literal["internal", "external"]
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
_PYTHON_REF = re.compile(r"^(?P<path>.+\.py)::(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")
_MCP_REF = re.compile(
    r"^mcp://(?P<server>[A-Za-z0-9][A-Za-z0-9_.-]*)/(?P<tool>[A-Za-z0-9_][A-Za-z0-9_.:/-]*)$"
)
_HOST = re.compile(
    r"^(\*|(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*)$"
)
_CIDR = re.compile(r"^[0-9A-Fa-f:.]+(/\d{1,3})?$")
_BUILTINS = frozenset(dir(builtins))


class _Strict(BaseModel):
    """Unknown keys are errors (a typo must not silently drop a setting); values never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def check_identifier(name: str, *, what: str) -> str:
    """``name`` if it can be called as a Python name without shadowing a keyword or a builtin."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"{what} {name!r} is not a Python identifier")
    if name in _BUILTINS:
        raise ValueError(f"{what} {name!r} would shadow the Python builtin {name}()")
    return name


@dataclass(frozen=True, slots=True)
class PythonRef:
    """``path/file.py::function``: a Python function run inside the sandbox."""

    path: str
    function: str
    kind: Literal["python"] = "python"


@dataclass(frozen=True, slots=True)
class McpRef:
    """``mcp://server/tool``: a tool of an MCP server configured in ``mcp_servers.yaml``."""

    server: str
    tool: str
    kind: Literal["mcp"] = "mcp"


def parse_implementation(text: str) -> PythonRef | McpRef:
    """Parse an ``implementation`` string; ``ValueError`` says which form was expected."""
    if text.startswith("mcp:"):
        match = _MCP_REF.match(text)
        if match is None:
            raise ValueError(
                f"implementation {text!r}: expected mcp://server/tool with a server name and a tool name"
            )
        return McpRef(server=match["server"], tool=match["tool"])
    match = _PYTHON_REF.match(text)
    if match is None:
        raise ValueError(
            f"implementation {text!r}: expected 'path/to/file.py::function' or 'mcp://server/tool'"
        )
    return PythonRef(path=match["path"], function=match["function"])


class Limits(_Strict):
    """Per-block sandbox limits for this persona; unset values fall back to the service's."""

    cpu_seconds: float | None = Field(default=None, gt=0, le=3600)
    memory_mb: int | None = Field(default=None, gt=0, le=1_048_576)
    wall_clock_seconds: float | None = Field(default=None, gt=0, le=86_400)
    stdout_bytes: int | None = Field(default=None, gt=0, le=1_073_741_824)
    max_processes: int | None = Field(default=None, gt=0, le=4096)
    file_size_mb: int | None = Field(default=None, gt=0, le=1_048_576)
    open_files: int | None = Field(default=None, gt=0, le=65_536)
    snapshot_bytes: int | None = Field(default=None, gt=0, le=4_294_967_296)
    disk_mb: int | None = Field(default=None, gt=0, le=1_048_576)
    disk_files: int | None = Field(default=None, gt=0, le=10_000_000)


class Network(_Strict):
    """Hosts the persona's network helpers may (``allow``) or may not (``deny``) reach.

    Entries are host names, ``*.domain`` wildcards, ``*`` (any host) or IP addresses/CIDR ranges.
    """

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    @field_validator("allow", "deny")
    @classmethod
    def _hosts(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        for host in hosts:
            if not (_HOST.match(host) or _CIDR.match(host)):
                raise ValueError(f"{host!r} is not a host name, *.domain wildcard, IP address or CIDR range")
        return hosts


class ToolReturns(_Strict):
    """What a custom tool returns: a Python annotation for its signature and a description."""

    type: str = "Any"
    description: str = ""

    @field_validator("type")
    @classmethod
    def _annotation(cls, value: str) -> str:
        try:
            ast.parse(value, mode="eval")
        except SyntaxError:
            raise ValueError(f"{value!r} is not a Python type annotation (e.g. dict, list[str])") from None
        return value


class CustomTool(_Strict):
    """A domain function the persona adds to the namespace: run by the service or by the caller."""

    name: str
    description: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    execution_mode: ExecutionMode
    implementation: str | None = None
    returns: ToolReturns | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return check_identifier(name, what="tool name")

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, schema: dict[str, Any]) -> dict[str, Any]:
        compile_schema(schema)  # its SchemaProblem (a ValueError) says what is wrong and where
        if schema.get("type") != "object":
            raise ValueError('must be a JSON Schema of type "object" (one property per argument)')
        for prop in schema.get("properties", {}):
            if not prop.isidentifier() or keyword.iskeyword(prop):
                raise ValueError(f"property {prop!r} is not a Python identifier, so it cannot be an argument")
        missing = [r for r in schema.get("required", ()) if r not in schema.get("properties", {})]
        if missing:
            raise ValueError(f"required names properties that are not declared: {', '.join(missing)}")
        return schema

    @model_validator(mode="after")
    def _implementation(self) -> CustomTool:
        if self.execution_mode == "internal" and not self.implementation:
            raise ValueError(
                "an internal tool needs an implementation: 'path/to/file.py::function' or 'mcp://server/tool'"
            )
        if self.execution_mode == "external" and self.implementation:
            raise ValueError("an external tool runs in the caller's environment: remove its implementation")
        if self.implementation:
            parse_implementation(self.implementation)
        return self

    @property
    def ref(self) -> PythonRef | McpRef | None:
        """The parsed implementation (``None`` for external tools)."""
        return parse_implementation(self.implementation) if self.implementation else None

    @property
    def runs(self) -> Runner:
        """Who runs it: the sandbox (a Python function), the service (an MCP tool) or the caller."""
        ref = self.ref
        return "caller" if ref is None else "sandbox" if ref.kind == "python" else "service"

    def render(self) -> str:
        """Prompt documentation: Python signature, description, parameters and returns."""
        return render_tool(
            self.name,
            self.description,
            self.parameters,
            returns=self.returns.type if self.returns else None,
            returns_description=self.returns.description if self.returns else None,
        )


class Persona(_Strict):
    """An agent identity: who it is, how it works (examples), what it features, what tools it adds."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    identity: str
    examples: tuple[str, ...] = ()
    featured_helpers: tuple[str, ...] = ("*",)
    custom_tools: tuple[CustomTool, ...] = ()
    model: str | None = Field(default=None, min_length=1, max_length=200)
    limits: Limits | None = None
    network: Network | None = None

    @field_validator("identity")
    @classmethod
    def _identity(cls, identity: str) -> str:
        if not identity.strip():
            raise ValueError("must not be empty: say who the agent is and how it works")
        return identity

    @field_validator("examples", mode="before")
    @classmethod
    def _examples(cls, value: Any) -> Any:
        """Seed-style ``examples: |`` (one Markdown text) is one example; ``null`` is none."""
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,) if value.strip() else ()
        return value

    @field_validator("custom_tools", mode="before")
    @classmethod
    def _tools_mapping(cls, value: Any) -> Any:
        """Seed-style ``custom_tools: {name: {...}}`` becomes a list whose entries carry the name."""
        if not isinstance(value, dict):
            return value
        tools = []
        for name, spec in value.items():
            if isinstance(spec, dict):
                if "name" in spec and spec["name"] != name:
                    raise ValueError(f"tool {name!r} has a different name inside: {spec['name']!r}")
                spec = {"name": name, **spec}
            tools.append(spec)
        return tools

    @model_validator(mode="after")
    def _unique(self) -> Persona:
        seen: set[str] = set()
        for tool in self.custom_tools:
            if tool.name in seen:
                raise ValueError(f"custom tool {tool.name!r} is declared twice")
            seen.add(tool.name)
        dupes = sorted({h for h in self.featured_helpers if self.featured_helpers.count(h) > 1})
        if dupes:
            raise ValueError(f"featured_helpers lists {', '.join(map(repr, dupes))} more than once")
        return self

    def tool(self, name: str) -> CustomTool | None:
        """The custom tool called ``name``, if the persona declares one."""
        return next((t for t in self.custom_tools if t.name == name), None)
