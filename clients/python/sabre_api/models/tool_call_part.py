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
    from ..models.tool_call_part_arguments import ToolCallPartArguments


T = TypeVar("T", bound="ToolCallPart")


@_attrs_define
class ToolCallPart:
    """An external tool call the code made; the turn paused on it.

    Attributes:
        arguments (ToolCallPartArguments):
        code (None | str):
        id (str):
        kind (Literal['tool_call']):  Default: 'tool_call'.
        name (str):
        seeded (bool | Unset): From the history the conversation was created with (`messages`), not made by a block.
            Default: False.
    """

    arguments: ToolCallPartArguments
    code: None | str
    id: str
    name: str
    kind: Literal["tool_call"] = "tool_call"
    seeded: bool | Unset = False
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        arguments = self.arguments.to_dict()

        code: None | str
        code = self.code

        id = self.id

        kind = self.kind

        name = self.name

        seeded = self.seeded

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "arguments": arguments,
                "code": code,
                "id": id,
                "kind": kind,
                "name": name,
            }
        )
        if seeded is not UNSET:
            field_dict["seeded"] = seeded

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.tool_call_part_arguments import ToolCallPartArguments

        d = dict(src_dict)
        arguments = ToolCallPartArguments.from_dict(d.pop("arguments"))

        def _parse_code(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        code = _parse_code(d.pop("code"))

        id = d.pop("id")

        kind = cast(Literal["tool_call"], d.pop("kind"))
        if kind != "tool_call":
            raise ValueError(f"kind must match const 'tool_call', got '{kind}'")

        name = d.pop("name")

        seeded = d.pop("seeded", UNSET)

        tool_call_part = cls(
            arguments=arguments,
            code=code,
            id=id,
            kind=kind,
            name=name,
            seeded=seeded,
        )

        tool_call_part.additional_properties = d
        return tool_call_part

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
