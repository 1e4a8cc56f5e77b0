from __future__ import annotations

from collections.abc import Mapping
from typing import (
    Any,
    Literal,
    Self,
    TypeVar,
    cast,
)

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="ToolResultPart")


@_attrs_define
class ToolResultPart:
    """The caller's answer to an external tool call.

    Attributes:
        error (None | str):
        kind (Literal['tool_result']):  Default: 'tool_result'.
        output (Any):
        tool_call_id (str):
        seeded (bool | Unset): From the history the conversation was created with (`messages`), not made by a block.
            Default: False.
    """

    error: None | str
    output: Any
    tool_call_id: str
    kind: Literal["tool_result"] = "tool_result"
    seeded: bool | Unset = False
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        error: None | str
        error = self.error

        kind = self.kind

        output = self.output

        tool_call_id = self.tool_call_id

        seeded = self.seeded

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "error": error,
                "kind": kind,
                "output": output,
                "tool_call_id": tool_call_id,
            }
        )
        if seeded is not UNSET:
            field_dict["seeded"] = seeded

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)

        def _parse_error(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        error = _parse_error(d.pop("error"))

        kind = cast(Literal["tool_result"], d.pop("kind"))
        if kind != "tool_result":
            raise ValueError(f"kind must match const 'tool_result', got '{kind}'")

        output = d.pop("output")

        tool_call_id = d.pop("tool_call_id")

        seeded = d.pop("seeded", UNSET)

        tool_result_part = cls(
            error=error,
            kind=kind,
            output=output,
            tool_call_id=tool_call_id,
            seeded=seeded,
        )

        tool_result_part.additional_properties = d
        return tool_result_part

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
