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
    from ..models.chunk_tool_call import ChunkToolCall


T = TypeVar("T", bound="ChunkDelta")


@_attrs_define
class ChunkDelta:
    """
    Attributes:
        content (None | str | Unset):
        role (Literal['assistant'] | None | Unset):
        tool_calls (list[ChunkToolCall] | None | Unset):
    """

    content: None | str | Unset = UNSET
    role: Literal["assistant"] | None | Unset = UNSET
    tool_calls: list[ChunkToolCall] | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        content: None | str | Unset
        if isinstance(self.content, Unset):
            content = UNSET
        else:
            content = self.content

        role: Literal["assistant"] | None | Unset
        if isinstance(self.role, Unset):
            role = UNSET
        else:
            role = self.role

        tool_calls: list[dict[str, Any]] | None | Unset
        if isinstance(self.tool_calls, Unset):
            tool_calls = UNSET
        elif isinstance(self.tool_calls, list):
            tool_calls = []
            for tool_calls_type_0_item_data in self.tool_calls:
                tool_calls_type_0_item = tool_calls_type_0_item_data.to_dict()
                tool_calls.append(tool_calls_type_0_item)

        else:
            tool_calls = self.tool_calls

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update({})
        if content is not UNSET:
            field_dict["content"] = content
        if role is not UNSET:
            field_dict["role"] = role
        if tool_calls is not UNSET:
            field_dict["tool_calls"] = tool_calls

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.chunk_tool_call import ChunkToolCall

        d = dict(src_dict)

        def _parse_content(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        content = _parse_content(d.pop("content", UNSET))

        def _parse_role(data: object) -> Literal["assistant"] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            role_type_0 = cast(Literal["assistant"], data)
            if role_type_0 != "assistant":
                raise ValueError(
                    f"role_type_0 must match const 'assistant', got '{role_type_0}'"
                )
            return role_type_0
            return cast(Literal["assistant"] | None | Unset, data)

        role = _parse_role(d.pop("role", UNSET))

        def _parse_tool_calls(data: object) -> list[ChunkToolCall] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                tool_calls_type_0 = []
                _tool_calls_type_0 = data
                for tool_calls_type_0_item_data in _tool_calls_type_0:
                    tool_calls_type_0_item = ChunkToolCall.from_dict(
                        tool_calls_type_0_item_data
                    )

                    tool_calls_type_0.append(tool_calls_type_0_item)

                return tool_calls_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[ChunkToolCall] | None | Unset, data)

        tool_calls = _parse_tool_calls(d.pop("tool_calls", UNSET))

        chunk_delta = cls(
            content=content,
            role=role,
            tool_calls=tool_calls,
        )

        chunk_delta.additional_properties = d
        return chunk_delta

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
