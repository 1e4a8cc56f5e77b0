"""The ToolRegistry: every tool a conversation's code can call, by name, and who runs it.

A tool is run by the service (an MCP tool: it has a ``handler``), by the sandbox next to the code (a
persona's Python function: ``sandbox``) or by the caller (an external tool: calling one pauses the
turn): ``Tool.runs``, the runtime's ``Runner`` words. Each tool renders its documentation as a
Python signature for the prompt.
"""

from __future__ import annotations

import keyword
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonschema.protocols import Validator

from app.personas.tooldoc import render_tool
from app.runtime.protocol import bind_params
from app.runtime.schemas import Runner, SandboxTool
from app.tools.schema import SchemaProblem, argument_errors, compile_schema

ToolHandler = Callable[[Mapping[str, Any]], Awaitable[Any]]


class ToolDefinitionError(ValueError):
    """A tool that cannot be registered; the message names the tool and the problem."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A callable tool: its JSON Schema parameters and who runs it (``runs``)."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    runs: Runner
    # A tool the service runs (an MCP tool): called with the call's JSON arguments.
    handler: ToolHandler | None = field(default=None, compare=False, hash=False)
    # A tool the sandbox runs, next to the code (a persona's Python function).
    sandbox: SandboxTool | None = field(default=None, compare=False, hash=False)
    _validator: Validator = field(repr=False, compare=False, hash=False, default=None)  # type: ignore[assignment]

    @property
    def param_names(self) -> list[str]:
        """Parameter names in schema order: positional arguments map onto these."""
        return list(self.parameters.get("properties", {}))

    def render(self) -> str:
        """Full documentation for the prompt: signature, description, each parameter."""
        return render_tool(self.name, self.description, self.parameters)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Positional arguments mapped to parameter names (schema order), merged with keywords."""
        return bind_params(self.name, self.param_names, args, kwargs)

    def validate_arguments(self, arguments: Mapping[str, Any]) -> str | None:
        """None when ``arguments`` fit the schema, else a message the model can act on."""
        validator = self._validator or compile_schema(self.parameters)
        described = argument_errors(validator, dict(arguments))
        if not described:
            return None
        return f"{self.name}(): invalid arguments: " + "; ".join(described)


def make_tool(
    *,
    name: str,
    description: str,
    parameters: Mapping[str, Any] | None,
    reserved: Iterable[str] = (),
    handler: ToolHandler | None = None,
    sandbox: SandboxTool | None = None,
) -> Tool:
    """Check a tool definition (identifier name, not reserved, a JSON Schema SABRE can apply safely,
    see app/tools/schema.py) and build it. Who runs it follows from what it has: the service with a
    ``handler``, the sandbox with ``sandbox`` source, the caller with neither."""
    if handler is not None and sandbox is not None:
        raise ToolDefinitionError(f"tool {name!r}: the service or the sandbox runs it, not both")
    runs: Runner = "service" if handler is not None else "sandbox" if sandbox is not None else "caller"
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ToolDefinitionError(f"tool {name!r}: the name must be a valid Python identifier")
    if name.startswith("__"):
        # The runtime refuses such names in a block's namespace (``__builtins__``, ``__name__``…):
        # accepted here, every block of the conversation failed as an internal error.
        raise ToolDefinitionError(f"tool {name!r}: names starting with '__' are the runtime's")
    if name in set(reserved):
        raise ToolDefinitionError(f"tool {name!r}: the name is taken by a built-in helper")
    schema = dict(parameters) if parameters is not None else {"type": "object", "properties": {}}
    try:
        validator = compile_schema(schema)
    except SchemaProblem as exc:
        raise ToolDefinitionError(f"tool {name!r}: parameters: {exc}") from exc
    if schema.get("type", "object") != "object":
        raise ToolDefinitionError(f"tool {name!r}: parameters must be a JSON Schema of type 'object'")
    if not isinstance(schema.get("properties", {}), dict):
        raise ToolDefinitionError(f"tool {name!r}: parameters.properties must be an object")
    if "" in schema.get("properties", {}):
        # Positional arguments map onto the names; the runtime refuses an empty one (every block
        # of the conversation failed as an internal error).
        raise ToolDefinitionError(f"tool {name!r}: parameters.properties: a parameter name cannot be empty")
    return Tool(
        name=name,
        description=description,
        parameters=schema,
        runs=runs,
        handler=handler,
        sandbox=sandbox,
        _validator=validator,
    )


class ToolRegistry:
    """Tools by name for one conversation; later registrations of a name replace earlier ones."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        """Add or replace a tool."""
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, if any."""
        return self._tools.get(name)

    def run_by(self, runs: Runner) -> list[Tool]:
        """The tools ``runs`` runs (the service, the sandbox or the caller), in registration order."""
        return [t for t in self._tools.values() if t.runs == runs]

    def sandbox_tools(self) -> list[SandboxTool]:
        """What the sandbox needs to run its tools (persona Python functions), in registration order."""
        return [t.sandbox for t in self._tools.values() if t.sandbox is not None]

    def __iter__(self) -> Any:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)
