from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="StreamOptions")


@_attrs_define
class StreamOptions:
    """
    Attributes:
        include_obfuscation (bool | None | Unset):
        include_usage (bool | Unset):  Default: False.
    """

    include_obfuscation: bool | None | Unset = UNSET
    include_usage: bool | Unset = False

    def to_dict(self) -> dict[str, Any]:
        include_obfuscation: bool | None | Unset
        if isinstance(self.include_obfuscation, Unset):
            include_obfuscation = UNSET
        else:
            include_obfuscation = self.include_obfuscation

        include_usage = self.include_usage

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if include_obfuscation is not UNSET:
            field_dict["include_obfuscation"] = include_obfuscation
        if include_usage is not UNSET:
            field_dict["include_usage"] = include_usage

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)

        def _parse_include_obfuscation(data: object) -> bool | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(bool | None | Unset, data)

        include_obfuscation = _parse_include_obfuscation(
            d.pop("include_obfuscation", UNSET)
        )

        include_usage = d.pop("include_usage", UNSET)

        stream_options = cls(
            include_obfuscation=include_obfuscation,
            include_usage=include_usage,
        )

        return stream_options
