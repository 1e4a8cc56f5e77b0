from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..models.system_message_role import SystemMessageRole, check_system_message_role
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.chat_text_part import ChatTextPart


T = TypeVar("T", bound="SystemMessage")


@_attrs_define
class SystemMessage:
    """A leading system or developer message: the conversation's instructions.

    Attributes:
        content (list[ChatTextPart] | str):
        role (SystemMessageRole):
        name (None | str | Unset):
    """

    content: list[ChatTextPart] | str
    role: SystemMessageRole
    name: None | str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        content: list[dict[str, Any]] | str
        if isinstance(self.content, list):
            content = []
            for content_type_1_item_data in self.content:
                content_type_1_item = content_type_1_item_data.to_dict()
                content.append(content_type_1_item)

        else:
            content = self.content

        role: str = self.role

        name: None | str | Unset
        if isinstance(self.name, Unset):
            name = UNSET
        else:
            name = self.name

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "content": content,
                "role": role,
            }
        )
        if name is not UNSET:
            field_dict["name"] = name

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

        role = check_system_message_role(d.pop("role"))

        def _parse_name(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        name = _parse_name(d.pop("name", UNSET))

        system_message = cls(
            content=content,
            role=role,
            name=name,
        )

        return system_message
