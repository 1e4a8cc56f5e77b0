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
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.chunk_function import ChunkFunction


T = TypeVar("T", bound="ChunkToolCall")


@_attrs_define
class ChunkToolCall:
    """
    Attributes:
        index (int):
        function (ChunkFunction | None | Unset):
        id (None | str | Unset):
        type_ (Literal['function'] | None | Unset):
    """

    index: int
    function: ChunkFunction | None | Unset = UNSET
    id: None | str | Unset = UNSET
    type_: Literal["function"] | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.chunk_function import ChunkFunction

        index = self.index

        function: dict[str, Any] | None | Unset
        if isinstance(self.function, Unset):
            function = UNSET
        elif isinstance(self.function, ChunkFunction):
            function = self.function.to_dict()
        else:
            function = self.function

        id: None | str | Unset
        if isinstance(self.id, Unset):
            id = UNSET
        else:
            id = self.id

        type_: Literal["function"] | None | Unset
        if isinstance(self.type_, Unset):
            type_ = UNSET
        else:
            type_ = self.type_

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "index": index,
            }
        )
        if function is not UNSET:
            field_dict["function"] = function
        if id is not UNSET:
            field_dict["id"] = id
        if type_ is not UNSET:
            field_dict["type"] = type_

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.chunk_function import ChunkFunction

        d = dict(src_dict)
        index = d.pop("index")

        def _parse_function(data: object) -> ChunkFunction | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                function_type_0 = ChunkFunction.from_dict(data)

                return function_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(ChunkFunction | None | Unset, data)

        function = _parse_function(d.pop("function", UNSET))

        def _parse_id(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        id = _parse_id(d.pop("id", UNSET))

        def _parse_type_(data: object) -> Literal["function"] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            type_type_0 = cast(Literal["function"], data)
            if type_type_0 != "function":
                raise ValueError(
                    f"type_type_0 must match const 'function', got '{type_type_0}'"
                )
            return type_type_0
            return cast(Literal["function"] | None | Unset, data)

        type_ = _parse_type_(d.pop("type", UNSET))

        chunk_tool_call = cls(
            index=index,
            function=function,
            id=id,
            type_=type_,
        )

        chunk_tool_call.additional_properties = d
        return chunk_tool_call

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
