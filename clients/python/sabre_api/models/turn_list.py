from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.turn_out import TurnOut


T = TypeVar("T", bound="TurnList")


@_attrs_define
class TurnList:
    """Turns of a conversation, newest first.

    Attributes:
        data (list[TurnOut]):
        has_more (bool):
        next_before (None | str): Pass as `before` to get the next (older) page.
    """

    data: list[TurnOut]
    has_more: bool
    next_before: None | str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = []
        for data_item_data in self.data:
            data_item = data_item_data.to_dict()
            data.append(data_item)

        has_more = self.has_more

        next_before: None | str
        next_before = self.next_before

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "data": data,
                "has_more": has_more,
                "next_before": next_before,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.turn_out import TurnOut

        d = dict(src_dict)
        data = []
        _data = d.pop("data")
        for data_item_data in _data:
            data_item = TurnOut.from_dict(data_item_data)

            data.append(data_item)

        has_more = d.pop("has_more")

        def _parse_next_before(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        next_before = _parse_next_before(d.pop("next_before"))

        turn_list = cls(
            data=data,
            has_more=has_more,
            next_before=next_before,
        )

        turn_list.additional_properties = d
        return turn_list

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
