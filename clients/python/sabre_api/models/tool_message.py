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
    from ..models.chat_text_part import ChatTextPart


T = TypeVar("T", bound="ToolMessage")


@_attrs_define
class ToolMessage:
    """
    Attributes:
        content (list[ChatTextPart] | str):
        role (Literal['tool']):
        tool_call_id (str):
    """

    content: list[ChatTextPart] | str
    role: Literal["tool"]
    tool_call_id: str

    def to_dict(self) -> dict[str, Any]:
        content: list[dict[str, Any]] | str
        if isinstance(self.content, list):
            content = []
            for content_type_1_item_data in self.content:
                content_type_1_item = content_type_1_item_data.to_dict()
                content.append(content_type_1_item)

        else:
            content = self.content

        role = self.role

        tool_call_id = self.tool_call_id

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "content": content,
                "role": role,
                "tool_call_id": tool_call_id,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.chat_text_part import ChatTextPart

        d = dict(src_dict)

        def _parse_content(data: object) -> list[ChatTextPart] | str:
            try:
                if not isinstance(data, list):
                    raise TypeError()
                content_type_1 = []
                _content_type_1 = data
                for content_type_1_item_data in _content_type_1:
                    content_type_1_item = ChatTextPart.from_dict(
                        content_type_1_item_data
                    )

                    content_type_1.append(content_type_1_item)

                return content_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[ChatTextPart] | str, data)

        content = _parse_content(d.pop("content"))

        role = cast(Literal["tool"], d.pop("role"))
        if role != "tool":
            raise ValueError(f"role must match const 'tool', got '{role}'")

        tool_call_id = d.pop("tool_call_id")

        tool_message = cls(
            content=content,
            role=role,
            tool_call_id=tool_call_id,
        )

        return tool_message
