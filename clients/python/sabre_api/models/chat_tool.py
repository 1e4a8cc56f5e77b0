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

if TYPE_CHECKING:
    from ..models.function_definition import FunctionDefinition


T = TypeVar("T", bound="ChatTool")


@_attrs_define
class ChatTool:
    """An external tool in the OpenAI Chat Completions shape: ``{type, function: {...}}``.

    Attributes:
        function (FunctionDefinition): The ``function`` object of the Chat Completions tool shape.
        type_ (Literal['function']):
    """

    function: FunctionDefinition
    type_: Literal["function"]

    def to_dict(self) -> dict[str, Any]:
        function = self.function.to_dict()

        type_ = self.type_

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "function": function,
                "type": type_,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.function_definition import FunctionDefinition

        d = dict(src_dict)
        function = FunctionDefinition.from_dict(d.pop("function"))

        type_ = cast(Literal["function"], d.pop("type"))
        if type_ != "function":
            raise ValueError(f"type must match const 'function', got '{type_}'")

        chat_tool = cls(
            function=function,
            type_=type_,
        )

        return chat_tool
