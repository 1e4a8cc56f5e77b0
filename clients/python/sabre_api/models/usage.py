from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="Usage")


@_attrs_define
class Usage:
    """Token and call totals: a turn's running ones (all LLM calls, the loop's and the helpers'), as
    stored with the turn and as the API shows them for a turn or a conversation.

        Attributes:
            input_tokens (int):  Default: 0.
            iterations (int):  Default: 0.
            llm_calls (int):  Default: 0.
            output_tokens (int):  Default: 0.
    """

    input_tokens: int = 0
    iterations: int = 0
    llm_calls: int = 0
    output_tokens: int = 0
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        input_tokens = self.input_tokens

        iterations = self.iterations

        llm_calls = self.llm_calls

        output_tokens = self.output_tokens

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "input_tokens": input_tokens,
                "iterations": iterations,
                "llm_calls": llm_calls,
                "output_tokens": output_tokens,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        input_tokens = d.pop("input_tokens")

        iterations = d.pop("iterations")

        llm_calls = d.pop("llm_calls")

        output_tokens = d.pop("output_tokens")

        usage = cls(
            input_tokens=input_tokens,
            iterations=iterations,
            llm_calls=llm_calls,
            output_tokens=output_tokens,
        )

        usage.additional_properties = d
        return usage

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
