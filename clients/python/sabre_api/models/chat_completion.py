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
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.choice import Choice
    from ..models.completion_usage import CompletionUsage


T = TypeVar("T", bound="ChatCompletion")


@_attrs_define
class ChatCompletion:
    """The answer: the turn's output (`finish_reason: stop`) or its pending calls (`tool_calls`).

    Attributes:
        choices (list[Choice]):
        created (int):
        id (str):
        model (str):
        usage (CompletionUsage):
        object_ (Literal['chat.completion'] | Unset):  Default: 'chat.completion'.
        system_fingerprint (None | str | Unset):
    """

    choices: list[Choice]
    created: int
    id: str
    model: str
    usage: CompletionUsage
    object_: Literal["chat.completion"] | Unset = "chat.completion"
    system_fingerprint: None | str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        choices = []
        for choices_item_data in self.choices:
            choices_item = choices_item_data.to_dict()
            choices.append(choices_item)

        created = self.created

        id = self.id

        model = self.model

        usage = self.usage.to_dict()

        object_ = self.object_

        system_fingerprint: None | str | Unset
        if isinstance(self.system_fingerprint, Unset):
            system_fingerprint = UNSET
        else:
            system_fingerprint = self.system_fingerprint

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "choices": choices,
                "created": created,
                "id": id,
                "model": model,
                "usage": usage,
            }
        )
        if object_ is not UNSET:
            field_dict["object"] = object_
        if system_fingerprint is not UNSET:
            field_dict["system_fingerprint"] = system_fingerprint

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.choice import Choice
        from ..models.completion_usage import CompletionUsage

        d = dict(src_dict)
        choices = []
        _choices = d.pop("choices")
        for choices_item_data in _choices:
            choices_item = Choice.from_dict(choices_item_data)

            choices.append(choices_item)

        created = d.pop("created")

        id = d.pop("id")

        model = d.pop("model")

        usage = CompletionUsage.from_dict(d.pop("usage"))

        object_ = cast(Literal["chat.completion"] | Unset, d.pop("object", UNSET))
        if object_ != "chat.completion" and not isinstance(object_, Unset):
            raise ValueError(
                f"object must match const 'chat.completion', got '{object_}'"
            )

        def _parse_system_fingerprint(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        system_fingerprint = _parse_system_fingerprint(
            d.pop("system_fingerprint", UNSET)
        )

        chat_completion = cls(
            choices=choices,
            created=created,
            id=id,
            model=model,
            usage=usage,
            object_=object_,
            system_fingerprint=system_fingerprint,
        )

        chat_completion.additional_properties = d
        return chat_completion

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
