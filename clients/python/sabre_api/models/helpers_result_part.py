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

from ..models.helpers_result_part_status import (
    HelpersResultPartStatus,
    check_helpers_result_part_status,
)

T = TypeVar("T", bound="HelpersResultPart")


@_attrs_define
class HelpersResultPart:
    """What running a block produced, exactly as the model was shown it.

    Attributes:
        dropped (list[str]):
        files (list[str]): Ids of the figures the block produced.
        kind (Literal['helpers_result']):  Default: 'helpers_result'.
        status (HelpersResultPartStatus):
        text (str):
    """

    dropped: list[str]
    files: list[str]
    status: HelpersResultPartStatus
    text: str
    kind: Literal["helpers_result"] = "helpers_result"
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        dropped = self.dropped

        files = self.files

        kind = self.kind

        status: str = self.status

        text = self.text

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "dropped": dropped,
                "files": files,
                "kind": kind,
                "status": status,
                "text": text,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        dropped = cast(list[str], d.pop("dropped"))

        files = cast(list[str], d.pop("files"))

        kind = cast(Literal["helpers_result"], d.pop("kind"))
        if kind != "helpers_result":
            raise ValueError(f"kind must match const 'helpers_result', got '{kind}'")

        status = check_helpers_result_part_status(d.pop("status"))

        text = d.pop("text")

        helpers_result_part = cls(
            dropped=dropped,
            files=files,
            kind=kind,
            status=status,
            text=text,
        )

        helpers_result_part.additional_properties = d
        return helpers_result_part

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
