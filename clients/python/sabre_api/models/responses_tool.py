from __future__ import annotations

from collections.abc import Mapping
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    Self,
    TypeVar,
    cast,
)

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.responses_tool_parameters_type_0 import ResponsesToolParametersType0


T = TypeVar("T", bound="ResponsesTool")


@_attrs_define
class ResponsesTool:
    """An external tool in the OpenAI Responses shape: ``{type, name, description, parameters}``.

    Attributes:
        name (str): A Python identifier (ASCII), neither a keyword nor a built-in helper's name.
        type_ (Literal['function']):
        description (str | Unset):  Default: ''.
        parameters (None | ResponsesToolParametersType0 | Unset):
        strict (bool | None | Unset):
    """

    name: str
    type_: Literal["function"]
    description: str | Unset = ""
    parameters: None | ResponsesToolParametersType0 | Unset = UNSET
    strict: bool | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.responses_tool_parameters_type_0 import (
            ResponsesToolParametersType0,
        )

        name = self.name

        type_ = self.type_

        description = self.description

        parameters: dict[str, Any] | None | Unset
        if isinstance(self.parameters, Unset):
            parameters = UNSET
        elif isinstance(self.parameters, ResponsesToolParametersType0):
            parameters = self.parameters.to_dict()
        else:
            parameters = self.parameters

        strict: bool | None | Unset
        if isinstance(self.strict, Unset):
            strict = UNSET
        else:
            strict = self.strict

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "name": name,
                "type": type_,
            }
        )
        if description is not UNSET:
            field_dict["description"] = description
        if parameters is not UNSET:
            field_dict["parameters"] = parameters
        if strict is not UNSET:
            field_dict["strict"] = strict

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.responses_tool_parameters_type_0 import (
            ResponsesToolParametersType0,
        )

        d = dict(src_dict)
        name = d.pop("name")

        type_ = cast(Literal["function"], d.pop("type"))
        if type_ != "function":
            raise ValueError(f"type must match const 'function', got '{type_}'")

        description = d.pop("description", UNSET)

        def _parse_parameters(
            data: object,
        ) -> None | ResponsesToolParametersType0 | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                parameters_type_0 = ResponsesToolParametersType0.from_dict(data)

                return parameters_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | ResponsesToolParametersType0 | Unset, data)

        parameters = _parse_parameters(d.pop("parameters", UNSET))

        def _parse_strict(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        strict = _parse_strict(d.pop("strict", UNSET))

        responses_tool = cls(
            name=name,
            type_=type_,
            description=description,
            parameters=parameters,
            strict=strict,
        )

        return responses_tool
