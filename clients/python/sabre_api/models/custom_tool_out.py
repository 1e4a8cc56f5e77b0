from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.custom_tool_out_execution_mode import (
    CustomToolOutExecutionMode,
    check_custom_tool_out_execution_mode,
)
from ..models.custom_tool_out_implementation_type_0 import (
    CustomToolOutImplementationType0,
    check_custom_tool_out_implementation_type_0,
)
from ..models.custom_tool_out_runs import CustomToolOutRuns, check_custom_tool_out_runs

if TYPE_CHECKING:
    from ..models.custom_tool_out_parameters import CustomToolOutParameters
    from ..models.tool_returns_out import ToolReturnsOut


T = TypeVar("T", bound="CustomToolOut")


@_attrs_define
class CustomToolOut:
    """A persona's custom tool: how it is called and who runs it.

    Attributes:
        description (str):
        execution_mode (CustomToolOutExecutionMode): As the persona file says it: `internal` (SABRE runs it, see `runs`)
            or `external`.
        implementation (CustomToolOutImplementationType0 | None): How an internal tool is implemented (a Python function
            or an MCP server's tool).
        name (str):
        parameters (CustomToolOutParameters): JSON Schema of the arguments.
        returns (None | ToolReturnsOut):
        runs (CustomToolOutRuns): Who runs it: `sandbox` (a Python function, next to the model's code), `service` (an
            MCP server's tool, called by the service) or `caller` (the turn pauses for the caller to run it).
        signature (str): The Python signature the model sees.
    """

    description: str
    execution_mode: CustomToolOutExecutionMode
    implementation: CustomToolOutImplementationType0 | None
    name: str
    parameters: CustomToolOutParameters
    returns: None | ToolReturnsOut
    runs: CustomToolOutRuns
    signature: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.tool_returns_out import ToolReturnsOut

        description = self.description

        execution_mode: str = self.execution_mode

        implementation: None | str
        if isinstance(self.implementation, str):
            implementation = self.implementation
        else:
            implementation = self.implementation

        name = self.name

        parameters = self.parameters.to_dict()

        returns: dict[str, Any] | None
        if isinstance(self.returns, ToolReturnsOut):
            returns = self.returns.to_dict()
        else:
            returns = self.returns

        runs: str = self.runs

        signature = self.signature

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "description": description,
                "execution_mode": execution_mode,
                "implementation": implementation,
                "name": name,
                "parameters": parameters,
                "returns": returns,
                "runs": runs,
                "signature": signature,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.custom_tool_out_parameters import CustomToolOutParameters
        from ..models.tool_returns_out import ToolReturnsOut

        d = dict(src_dict)
        description = d.pop("description")

        execution_mode = check_custom_tool_out_execution_mode(d.pop("execution_mode"))

        def _parse_implementation(
            data: object,
        ) -> CustomToolOutImplementationType0 | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                implementation_type_0 = check_custom_tool_out_implementation_type_0(
                    data
                )

                return implementation_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(CustomToolOutImplementationType0 | None, data)

        implementation = _parse_implementation(d.pop("implementation"))

        name = d.pop("name")

        parameters = CustomToolOutParameters.from_dict(d.pop("parameters"))

        def _parse_returns(data: object) -> None | ToolReturnsOut:
            if data is None:
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                returns_type_0 = ToolReturnsOut.from_dict(data)

                return returns_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | ToolReturnsOut, data)

        returns = _parse_returns(d.pop("returns"))

        runs = check_custom_tool_out_runs(d.pop("runs"))

        signature = d.pop("signature")

        custom_tool_out = cls(
            description=description,
            execution_mode=execution_mode,
            implementation=implementation,
            name=name,
            parameters=parameters,
            returns=returns,
            runs=runs,
            signature=signature,
        )

        custom_tool_out.additional_properties = d
        return custom_tool_out

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
