from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="ToolError")


@_attrs_define
class ToolError:
    """The caller's answer to one pending call: it failed with this ``error`` message (raised in the code).

    Attributes:
        error (str):
        tool_call_id (str):
    """

    error: str
    tool_call_id: str

    def to_dict(self) -> dict[str, Any]:
        error = self.error

        tool_call_id = self.tool_call_id

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "error": error,
                "tool_call_id": tool_call_id,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        error = d.pop("error")

        tool_call_id = d.pop("tool_call_id")

        tool_error = cls(
            error=error,
            tool_call_id=tool_call_id,
        )

        return tool_error
