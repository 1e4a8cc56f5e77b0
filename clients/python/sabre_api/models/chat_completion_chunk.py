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
    from ..models.chunk_choice import ChunkChoice
    from ..models.completion_usage import CompletionUsage


T = TypeVar("T", bound="ChatCompletionChunk")


@_attrs_define
class ChatCompletionChunk:
    """One ``data:`` line of a streamed answer (the stream ends with ``data: [DONE]``).

    Attributes:
        choices (list[ChunkChoice]):
        created (int):
        id (str):
        model (str):
        object_ (Literal['chat.completion.chunk'] | Unset):  Default: 'chat.completion.chunk'.
        system_fingerprint (None | str | Unset):
        usage (CompletionUsage | None | Unset):
    """

    choices: list[ChunkChoice]
    created: int
    id: str
    model: str
    object_: Literal["chat.completion.chunk"] | Unset = "chat.completion.chunk"
    system_fingerprint: None | str | Unset = UNSET
    usage: CompletionUsage | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.completion_usage import CompletionUsage

        choices = []
        for choices_item_data in self.choices:
            choices_item = choices_item_data.to_dict()
            choices.append(choices_item)

        created = self.created

        id = self.id

        model = self.model

        object_ = self.object_

        system_fingerprint: None | str | Unset
        if isinstance(self.system_fingerprint, Unset):
            system_fingerprint = UNSET
        else:
            system_fingerprint = self.system_fingerprint

        usage: dict[str, Any] | None | Unset
        if isinstance(self.usage, Unset):
            usage = UNSET
        elif isinstance(self.usage, CompletionUsage):
            usage = self.usage.to_dict()
        else:
            usage = self.usage

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "choices": choices,
                "created": created,
                "id": id,
                "model": model,
            }
        )
        if object_ is not UNSET:
            field_dict["object"] = object_
        if system_fingerprint is not UNSET:
            field_dict["system_fingerprint"] = system_fingerprint
        if usage is not UNSET:
            field_dict["usage"] = usage

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.chunk_choice import ChunkChoice
        from ..models.completion_usage import CompletionUsage

        d = dict(src_dict)
        choices = []
        _choices = d.pop("choices")
        for choices_item_data in _choices:
            choices_item = ChunkChoice.from_dict(choices_item_data)

            choices.append(choices_item)

        created = d.pop("created")

        id = d.pop("id")

        model = d.pop("model")

        object_ = cast(Literal["chat.completion.chunk"] | Unset, d.pop("object", UNSET))
        if object_ != "chat.completion.chunk" and not isinstance(object_, Unset):
            raise ValueError(
                f"object must match const 'chat.completion.chunk', got '{object_}'"
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

        def _parse_usage(data: object) -> CompletionUsage | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                usage_type_0 = CompletionUsage.from_dict(data)

                return usage_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(CompletionUsage | None | Unset, data)

        usage = _parse_usage(d.pop("usage", UNSET))

        chat_completion_chunk = cls(
            choices=choices,
            created=created,
            id=id,
            model=model,
            object_=object_,
            system_fingerprint=system_fingerprint,
            usage=usage,
        )

        chat_completion_chunk.additional_properties = d
        return chat_completion_chunk

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
