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
    from ..models.history_tool_call import HistoryToolCall


T = TypeVar("T", bound="HistoryAssistant")


@_attrs_define
class HistoryAssistant:
    """An assistant message of the history: text, tool calls, or both.

    Attributes:
        role (Literal['assistant']):
        content (None | str | Unset):
        tool_calls (list[HistoryToolCall] | Unset):
    """

    role: Literal["assistant"]
    content: None | str | Unset = UNSET
    tool_calls: list[HistoryToolCall] | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        role = self.role

        content: None | str | Unset
        if isinstance(self.content, Unset):
            content = UNSET
        else:
            content = self.content

        tool_calls: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.tool_calls, Unset):
            tool_calls = []
            for tool_calls_item_data in self.tool_calls:
                tool_calls_item = tool_calls_item_data.to_dict()
                tool_calls.append(tool_calls_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "role": role,
            }
        )
        if content is not UNSET:
            field_dict["content"] = content
        if tool_calls is not UNSET:
            field_dict["tool_calls"] = tool_calls

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.history_tool_call import HistoryToolCall

        d = dict(src_dict)
        role = cast(Literal["assistant"], d.pop("role"))
        if role != "assistant":
            raise ValueError(f"role must match const 'assistant', got '{role}'")

        def _parse_content(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        content = _parse_content(d.pop("content", UNSET))

        _tool_calls = d.pop("tool_calls", UNSET)
        tool_calls: list[HistoryToolCall] | Unset = UNSET
        if _tool_calls is not UNSET:
            tool_calls = []
            for tool_calls_item_data in _tool_calls:
                tool_calls_item = HistoryToolCall.from_dict(tool_calls_item_data)

                tool_calls.append(tool_calls_item)

        history_assistant = cls(
            role=role,
            content=content,
            tool_calls=tool_calls,
        )

        return history_assistant
