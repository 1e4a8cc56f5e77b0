from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.custom_tool_out import CustomToolOut
    from ..models.persona_limits import PersonaLimits
    from ..models.persona_network import PersonaNetwork


T = TypeVar("T", bound="PersonaDetail")


@_attrs_define
class PersonaDetail:
    """A persona in full: its identity, examples and limits too.

    Attributes:
        custom_tools (list[CustomToolOut]):
        description (str):
        documented_helpers (list[str]): Helpers whose full docs are in the prompt.
        examples (list[str]):
        featured_helpers (list[str]): As declared; `*` features every helper.
        identity (str):
        limits (None | PersonaLimits):
        model (None | str): The model this persona asks for, if any.
        name (str):
        network (None | PersonaNetwork):
        prompt_tokens (int): Size of the persona's rendered system prompt (no request tools or instructions).
        tokenizer (str): What counted `prompt_tokens`: `cl100k_base`, or `estimate:chars/4` when unavailable.
    """

    custom_tools: list[CustomToolOut]
    description: str
    documented_helpers: list[str]
    examples: list[str]
    featured_helpers: list[str]
    identity: str
    limits: None | PersonaLimits
    model: None | str
    name: str
    network: None | PersonaNetwork
    prompt_tokens: int
    tokenizer: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.persona_limits import PersonaLimits
        from ..models.persona_network import PersonaNetwork

        custom_tools = []
        for custom_tools_item_data in self.custom_tools:
            custom_tools_item = custom_tools_item_data.to_dict()
            custom_tools.append(custom_tools_item)

        description = self.description

        documented_helpers = self.documented_helpers

        examples = self.examples

        featured_helpers = self.featured_helpers

        identity = self.identity

        limits: dict[str, Any] | None
        if isinstance(self.limits, PersonaLimits):
            limits = self.limits.to_dict()
        else:
            limits = self.limits

        model: None | str
        model = self.model

        name = self.name

        network: dict[str, Any] | None
        if isinstance(self.network, PersonaNetwork):
            network = self.network.to_dict()
        else:
            network = self.network

        prompt_tokens = self.prompt_tokens

        tokenizer = self.tokenizer

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "custom_tools": custom_tools,
                "description": description,
                "documented_helpers": documented_helpers,
                "examples": examples,
                "featured_helpers": featured_helpers,
                "identity": identity,
                "limits": limits,
                "model": model,
                "name": name,
                "network": network,
                "prompt_tokens": prompt_tokens,
                "tokenizer": tokenizer,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.custom_tool_out import CustomToolOut
        from ..models.persona_limits import PersonaLimits
        from ..models.persona_network import PersonaNetwork

        d = dict(src_dict)
        custom_tools = []
        _custom_tools = d.pop("custom_tools")
        for custom_tools_item_data in _custom_tools:
            custom_tools_item = CustomToolOut.from_dict(custom_tools_item_data)

            custom_tools.append(custom_tools_item)

        description = d.pop("description")

        documented_helpers = cast(list[str], d.pop("documented_helpers"))

        examples = cast(list[str], d.pop("examples"))

        featured_helpers = cast(list[str], d.pop("featured_helpers"))

        identity = d.pop("identity")

        def _parse_limits(data: object) -> None | PersonaLimits:
            if data is None:
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                limits_type_0 = PersonaLimits.from_dict(data)

                return limits_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | PersonaLimits, data)

        limits = _parse_limits(d.pop("limits"))

        def _parse_model(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        model = _parse_model(d.pop("model"))

        name = d.pop("name")

        def _parse_network(data: object) -> None | PersonaNetwork:
            if data is None:
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                network_type_0 = PersonaNetwork.from_dict(data)

                return network_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | PersonaNetwork, data)

        network = _parse_network(d.pop("network"))

        prompt_tokens = d.pop("prompt_tokens")

        tokenizer = d.pop("tokenizer")

        persona_detail = cls(
            custom_tools=custom_tools,
            description=description,
            documented_helpers=documented_helpers,
            examples=examples,
            featured_helpers=featured_helpers,
            identity=identity,
            limits=limits,
            model=model,
            name=name,
            network=network,
            prompt_tokens=prompt_tokens,
            tokenizer=tokenizer,
        )

        persona_detail.additional_properties = d
        return persona_detail

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
