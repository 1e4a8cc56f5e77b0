from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.choice_finish_reason import ChoiceFinishReason, check_choice_finish_reason
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.response_message import ResponseMessage


T = TypeVar("T", bound="Choice")


@_attrs_define
class Choice:
    """
    Attributes:
        finish_reason (ChoiceFinishReason):
        message (ResponseMessage):
        index (int | Unset):  Default: 0.
        logprobs (None | Unset):
    """

    finish_reason: ChoiceFinishReason
    message: ResponseMessage
    index: int | Unset = 0
    logprobs: None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        finish_reason: str = self.finish_reason

        message = self.message.to_dict()

        index = self.index

        logprobs = self.logprobs

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "finish_reason": finish_reason,
                "message": message,
            }
        )
        if index is not UNSET:
            field_dict["index"] = index
        if logprobs is not UNSET:
            field_dict["logprobs"] = logprobs

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.response_message import ResponseMessage

        d = dict(src_dict)
        finish_reason = check_choice_finish_reason(d.pop("finish_reason"))

        message = ResponseMessage.from_dict(d.pop("message"))

        index = d.pop("index", UNSET)

        logprobs = d.pop("logprobs", UNSET)

        choice = cls(
            finish_reason=finish_reason,
            message=message,
            index=index,
            logprobs=logprobs,
        )

        choice.additional_properties = d
        return choice

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
