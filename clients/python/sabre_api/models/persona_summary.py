from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.custom_tool_out import CustomToolOut


T = TypeVar("T", bound="PersonaSummary")


@_attrs_define
class PersonaSummary:
    """What a client needs to choose a persona.

    Attributes:
        custom_tools (list[CustomToolOut]):
        description (str):
        documented_helpers (list[str]): Helpers whose full docs are in the prompt.
        featured_helpers (list[str]): As declared; `*` features every helper.
        model (None | str): The model this persona asks for, if any.
        name (str):
        prompt_tokens (int): Size of the persona's rendered system prompt (no request tools or instructions).
        tokenizer (str): What counted `prompt_tokens`: `cl100k_base`, or `estimate:chars/4` when unavailable.
    """

    custom_tools: list[CustomToolOut]
    description: str
    documented_helpers: list[str]
    featured_helpers: list[str]
    model: None | str
    name: str
    prompt_tokens: int
    tokenizer: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        custom_tools = []
        for custom_tools_item_data in self.custom_tools:
            custom_tools_item = custom_tools_item_data.to_dict()
            custom_tools.append(custom_tools_item)

        description = self.description

        documented_helpers = self.documented_helpers

        featured_helpers = self.featured_helpers

        model: None | str
        model = self.model

        name = self.name

        prompt_tokens = self.prompt_tokens

        tokenizer = self.tokenizer

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "custom_tools": custom_tools,
                "description": description,
                "documented_helpers": documented_helpers,
                "featured_helpers": featured_helpers,
                "model": model,
                "name": name,
                "prompt_tokens": prompt_tokens,
                "tokenizer": tokenizer,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.custom_tool_out import CustomToolOut

        d = dict(src_dict)
        custom_tools = []
        _custom_tools = d.pop("custom_tools")
        for custom_tools_item_data in _custom_tools:
            custom_tools_item = CustomToolOut.from_dict(custom_tools_item_data)

            custom_tools.append(custom_tools_item)

        description = d.pop("description")

        documented_helpers = cast(list[str], d.pop("documented_helpers"))

        featured_helpers = cast(list[str], d.pop("featured_helpers"))

        def _parse_model(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        model = _parse_model(d.pop("model"))

        name = d.pop("name")

        prompt_tokens = d.pop("prompt_tokens")

        tokenizer = d.pop("tokenizer")

        persona_summary = cls(
            custom_tools=custom_tools,
            description=description,
            documented_helpers=documented_helpers,
            featured_helpers=featured_helpers,
            model=model,
            name=name,
            prompt_tokens=prompt_tokens,
            tokenizer=tokenizer,
        )

        persona_summary.additional_properties = d
        return persona_summary

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
