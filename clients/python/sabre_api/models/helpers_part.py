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

T = TypeVar("T", bound="HelpersPart")


@_attrs_define
class HelpersPart:
    """A ``<helpers>`` block the model wrote.

    Attributes:
        closed (bool):  Default: True.
        code (str):
        kind (Literal['helpers']):  Default: 'helpers'.
    """

    code: str
    closed: bool = True
    kind: Literal["helpers"] = "helpers"
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        closed = self.closed

        code = self.code

        kind = self.kind

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "closed": closed,
                "code": code,
                "kind": kind,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        closed = d.pop("closed")

        code = d.pop("code")

        kind = cast(Literal["helpers"], d.pop("kind"))
        if kind != "helpers":
            raise ValueError(f"kind must match const 'helpers', got '{kind}'")

        helpers_part = cls(
            closed=closed,
            code=code,
            kind=kind,
        )

        helpers_part.additional_properties = d
        return helpers_part

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
