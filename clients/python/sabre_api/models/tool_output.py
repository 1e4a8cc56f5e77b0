from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="ToolOutput")


@_attrs_define
class ToolOutput:
    """The caller's answer to one pending call: its ``output`` (any JSON, ``null`` included).

    Attributes:
        output (Any): What the call returns to the code (any JSON).
        tool_call_id (str):
    """

    output: Any
    tool_call_id: str

    def to_dict(self) -> dict[str, Any]:
        output = self.output

        tool_call_id = self.tool_call_id

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "output": output,
                "tool_call_id": tool_call_id,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        output = d.pop("output")

        tool_call_id = d.pop("tool_call_id")

        tool_output = cls(
            output=output,
            tool_call_id=tool_call_id,
        )

        return tool_output
