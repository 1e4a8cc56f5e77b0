from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="FunctionCall")


@_attrs_define
class FunctionCall:
    """
    Attributes:
        arguments (str): The arguments, as a JSON object in a string.
        name (str):
    """

    arguments: str
    name: str

    def to_dict(self) -> dict[str, Any]:
        arguments = self.arguments

        name = self.name

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "arguments": arguments,
                "name": name,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        arguments = d.pop("arguments")

        name = d.pop("name")

        function_call = cls(
            arguments=arguments,
            name=name,
        )

        return function_call
