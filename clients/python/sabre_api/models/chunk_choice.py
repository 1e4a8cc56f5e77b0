from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.chunk_choice_finish_reason_type_0 import (
    ChunkChoiceFinishReasonType0,
    check_chunk_choice_finish_reason_type_0,
)
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.chunk_delta import ChunkDelta


T = TypeVar("T", bound="ChunkChoice")


@_attrs_define
class ChunkChoice:
    """
    Attributes:
        delta (ChunkDelta):
        finish_reason (ChunkChoiceFinishReasonType0 | None | Unset):
        index (int | Unset):  Default: 0.
        logprobs (None | Unset):
    """

    delta: ChunkDelta
    finish_reason: ChunkChoiceFinishReasonType0 | None | Unset = UNSET
    index: int | Unset = 0
    logprobs: None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        delta = self.delta.to_dict()

        finish_reason: None | str | Unset
        if isinstance(self.finish_reason, Unset):
            finish_reason = UNSET
        elif isinstance(self.finish_reason, str):
            finish_reason = self.finish_reason
        else:
            finish_reason = self.finish_reason

        index = self.index

        logprobs = self.logprobs

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "delta": delta,
            }
        )
        if finish_reason is not UNSET:
            field_dict["finish_reason"] = finish_reason
        if index is not UNSET:
            field_dict["index"] = index
        if logprobs is not UNSET:
            field_dict["logprobs"] = logprobs

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.chunk_delta import ChunkDelta

        d = dict(src_dict)
        delta = ChunkDelta.from_dict(d.pop("delta"))

        def _parse_finish_reason(
            data: object,
        ) -> ChunkChoiceFinishReasonType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                finish_reason_type_0 = check_chunk_choice_finish_reason_type_0(data)

                return finish_reason_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(ChunkChoiceFinishReasonType0 | None | Unset, data)

        finish_reason = _parse_finish_reason(d.pop("finish_reason", UNSET))

        index = d.pop("index", UNSET)

        logprobs = d.pop("logprobs", UNSET)

        chunk_choice = cls(
            delta=delta,
            finish_reason=finish_reason,
            index=index,
            logprobs=logprobs,
        )

        chunk_choice.additional_properties = d
        return chunk_choice

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
