from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.event_out_type import EventOutType, check_event_out_type

if TYPE_CHECKING:
    from ..models.event_out_data import EventOutData


T = TypeVar("T", bound="EventOut")


@_attrs_define
class EventOut:
    """One event of a turn. ``seq`` orders a conversation's events without gaps; ``parent_id`` is the
    event that opened the node this one belongs to (the turn, an LLM call, a block, a helper).

        Attributes:
            created_at (datetime.datetime):
            data (EventOutData):
            id (str):
            parent_id (None | str):
            seq (int):
            turn_id (str):
            type_ (EventOutType):
    """

    created_at: datetime.datetime
    data: EventOutData
    id: str
    parent_id: None | str
    seq: int
    turn_id: str
    type_: EventOutType
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at.isoformat()

        data = self.data.to_dict()

        id = self.id

        parent_id: None | str
        parent_id = self.parent_id

        seq = self.seq

        turn_id = self.turn_id

        type_: str = self.type_

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "data": data,
                "id": id,
                "parent_id": parent_id,
                "seq": seq,
                "turn_id": turn_id,
                "type": type_,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.event_out_data import EventOutData

        d = dict(src_dict)
        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        data = EventOutData.from_dict(d.pop("data"))

        id = d.pop("id")

        def _parse_parent_id(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        parent_id = _parse_parent_id(d.pop("parent_id"))

        seq = d.pop("seq")

        turn_id = d.pop("turn_id")

        type_ = check_event_out_type(d.pop("type"))

        event_out = cls(
            created_at=created_at,
            data=data,
            id=id,
            parent_id=parent_id,
            seq=seq,
            turn_id=turn_id,
            type_=type_,
        )

        event_out.additional_properties = d
        return event_out

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
