from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.message_out_role import MessageOutRole, check_message_out_role

if TYPE_CHECKING:
    from ..models.helpers_part import HelpersPart
    from ..models.helpers_result_part import HelpersResultPart
    from ..models.text_part import TextPart
    from ..models.tool_call_part import ToolCallPart
    from ..models.tool_result_part import ToolResultPart


T = TypeVar("T", bound="MessageOut")


@_attrs_define
class MessageOut:
    """
    Attributes:
        created_at (datetime.datetime):
        id (str):
        parts (list[HelpersPart | HelpersResultPart | TextPart | ToolCallPart | ToolResultPart]):
        role (MessageOutRole):
        seq (int):
        turn_id (str):
    """

    created_at: datetime.datetime
    id: str
    parts: list[
        HelpersPart | HelpersResultPart | TextPart | ToolCallPart | ToolResultPart
    ]
    role: MessageOutRole
    seq: int
    turn_id: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.helpers_part import HelpersPart
        from ..models.helpers_result_part import HelpersResultPart
        from ..models.text_part import TextPart
        from ..models.tool_call_part import ToolCallPart

        created_at = self.created_at.isoformat()

        id = self.id

        parts = []
        for parts_item_data in self.parts:
            parts_item: dict[str, Any]
            if (
                isinstance(parts_item_data, TextPart)
                or isinstance(parts_item_data, HelpersPart)
                or isinstance(parts_item_data, HelpersResultPart)
                or isinstance(parts_item_data, ToolCallPart)
            ):
                parts_item = parts_item_data.to_dict()
            else:
                parts_item = parts_item_data.to_dict()

            parts.append(parts_item)

        role: str = self.role

        seq = self.seq

        turn_id = self.turn_id

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "id": id,
                "parts": parts,
                "role": role,
                "seq": seq,
                "turn_id": turn_id,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.helpers_part import HelpersPart
        from ..models.helpers_result_part import HelpersResultPart
        from ..models.text_part import TextPart
        from ..models.tool_call_part import ToolCallPart
        from ..models.tool_result_part import ToolResultPart

        d = dict(src_dict)
        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        id = d.pop("id")

        parts = []
        _parts = d.pop("parts")
        for parts_item_data in _parts:

            def _parse_parts_item(
                data: object,
            ) -> (
                HelpersPart
                | HelpersResultPart
                | TextPart
                | ToolCallPart
                | ToolResultPart
            ):
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    parts_item_type_0 = TextPart.from_dict(data)

                    return parts_item_type_0
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    parts_item_type_1 = HelpersPart.from_dict(data)

                    return parts_item_type_1
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    parts_item_type_2 = HelpersResultPart.from_dict(data)

                    return parts_item_type_2
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    parts_item_type_3 = ToolCallPart.from_dict(data)

                    return parts_item_type_3
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                if not isinstance(data, dict):
                    raise TypeError()
                parts_item_type_4 = ToolResultPart.from_dict(data)

                return parts_item_type_4

            parts_item = _parse_parts_item(parts_item_data)

            parts.append(parts_item)

        role = check_message_out_role(d.pop("role"))

        seq = d.pop("seq")

        turn_id = d.pop("turn_id")

        message_out = cls(
            created_at=created_at,
            id=id,
            parts=parts,
            role=role,
            seq=seq,
            turn_id=turn_id,
        )

        message_out.additional_properties = d
        return message_out

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
