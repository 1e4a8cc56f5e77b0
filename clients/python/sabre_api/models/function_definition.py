from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.function_definition_parameters_type_0 import (
        FunctionDefinitionParametersType0,
    )


T = TypeVar("T", bound="FunctionDefinition")


@_attrs_define
class FunctionDefinition:
    """The ``function`` object of the Chat Completions tool shape.

    Attributes:
        name (str): A Python identifier (ASCII), neither a keyword nor a built-in helper's name.
        description (str | Unset):  Default: ''.
        parameters (FunctionDefinitionParametersType0 | None | Unset):
        strict (bool | None | Unset):
    """

    name: str
    description: str | Unset = ""
    parameters: FunctionDefinitionParametersType0 | None | Unset = UNSET
    strict: bool | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.function_definition_parameters_type_0 import (
            FunctionDefinitionParametersType0,
        )

        name = self.name

        description = self.description

        parameters: dict[str, Any] | None | Unset
        if isinstance(self.parameters, Unset):
            parameters = UNSET
        elif isinstance(self.parameters, FunctionDefinitionParametersType0):
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
        from ..models.function_definition_parameters_type_0 import (
            FunctionDefinitionParametersType0,
        )

        d = dict(src_dict)
        name = d.pop("name")

        description = d.pop("description", UNSET)

        def _parse_parameters(
            data: object,
        ) -> FunctionDefinitionParametersType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                parameters_type_0 = FunctionDefinitionParametersType0.from_dict(data)

                return parameters_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(FunctionDefinitionParametersType0 | None | Unset, data)

        parameters = _parse_parameters(d.pop("parameters", UNSET))

        def _parse_strict(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        strict = _parse_strict(d.pop("strict", UNSET))

        function_definition = cls(
            name=name,
            description=description,
            parameters=parameters,
            strict=strict,
        )

        return function_definition
