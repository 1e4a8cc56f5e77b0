from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="TurnErrorBody")


@_attrs_define
class TurnErrorBody:
    """
    Attributes:
        code (str): Stable: `llm_unavailable`, `llm_rate_limited`, `llm_bad_response`, `llm_bad_request` (the model
            server), `max_iterations_reached`, `turn_not_stored`, `turn_superseded`, `runner_lost`, `internal_error`. A
            string, not an enum: a later version may add codes.
        message (str):
        retryable (bool):
    """

    code: str
    message: str
    retryable: bool
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        code = self.code

        message = self.message

        retryable = self.retryable

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "code": code,
                "message": message,
                "retryable": retryable,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        code = d.pop("code")

        message = d.pop("message")

        retryable = d.pop("retryable")

        turn_error_body = cls(
            code=code,
            message=message,
            retryable=retryable,
        )

        turn_error_body.additional_properties = d
        return turn_error_body

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
