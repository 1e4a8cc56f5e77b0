from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.history_tool_call_arguments import HistoryToolCallArguments


T = TypeVar("T", bound="HistoryToolCall")


@_attrs_define
class HistoryToolCall:
    """A tool call an assistant message of the history made.

    Attributes:
        id (str):
        name (str):
        arguments (HistoryToolCallArguments | Unset):
    """

    id: str
    name: str
    arguments: HistoryToolCallArguments | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        id = self.id

        name = self.name

        arguments: dict[str, Any] | Unset = UNSET
        if not isinstance(self.arguments, Unset):
            arguments = self.arguments.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "id": id,
                "name": name,
            }
        )
        if arguments is not UNSET:
            field_dict["arguments"] = arguments

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.history_tool_call_arguments import HistoryToolCallArguments

        d = dict(src_dict)
        id = d.pop("id")

        name = d.pop("name")

        _arguments = d.pop("arguments", UNSET)
        arguments: HistoryToolCallArguments | Unset
        if isinstance(_arguments, Unset):
            arguments = UNSET
        else:
            arguments = HistoryToolCallArguments.from_dict(_arguments)

        history_tool_call = cls(
            id=id,
            name=name,
            arguments=arguments,
        )

        return history_tool_call
