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
    from ..models.function_call import FunctionCall


T = TypeVar("T", bound="ToolCall")


@_attrs_define
class ToolCall:
    """
    Attributes:
        function (FunctionCall):
        id (str):
        name (None | str | Unset):
        type_ (Literal['function'] | Unset):  Default: 'function'.
    """

    function: FunctionCall
    id: str
    name: None | str | Unset = UNSET
    type_: Literal["function"] | Unset = "function"

    def to_dict(self) -> dict[str, Any]:
        function = self.function.to_dict()

        id = self.id

        name: None | str | Unset
        if isinstance(self.name, Unset):
            name = UNSET
        else:
            name = self.name

        type_ = self.type_

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "function": function,
                "id": id,
            }
        )
        if name is not UNSET:
            field_dict["name"] = name
        if type_ is not UNSET:
            field_dict["type"] = type_

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.function_call import FunctionCall

        d = dict(src_dict)
        function = FunctionCall.from_dict(d.pop("function"))

        id = d.pop("id")

        def _parse_name(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        name = _parse_name(d.pop("name", UNSET))

        type_ = cast(Literal["function"] | Unset, d.pop("type", UNSET))
        if type_ != "function" and not isinstance(type_, Unset):
            raise ValueError(f"type must match const 'function', got '{type_}'")

        tool_call = cls(
            function=function,
            id=id,
            name=name,
            type_=type_,
        )

        return tool_call
