from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.conversation_out_status import (
    ConversationOutStatus,
    check_conversation_out_status,
)

if TYPE_CHECKING:
    from ..models.conversation_out_metadata import ConversationOutMetadata
    from ..models.pending_tool_call import PendingToolCall
    from ..models.usage import Usage


T = TypeVar("T", bound="ConversationOut")


@_attrs_define
class ConversationOut:
    """A conversation's state.

    Attributes:
        created_at (datetime.datetime):
        id (str):
        max_iterations (int):
        metadata (ConversationOutMetadata):
        model (str):
        pending_tool_calls (list[PendingToolCall]):
        persona (str):
        status (ConversationOutStatus):
        updated_at (datetime.datetime):
        usage (Usage): Token and call totals: a turn's running ones (all LLM calls, the loop's and the helpers'), as
            stored with the turn and as the API shows them for a turn or a conversation.
        version (int):
    """

    created_at: datetime.datetime
    id: str
    max_iterations: int
    metadata: ConversationOutMetadata
    model: str
    pending_tool_calls: list[PendingToolCall]
    persona: str
    status: ConversationOutStatus
    updated_at: datetime.datetime
    usage: Usage
    version: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at.isoformat()

        id = self.id

        max_iterations = self.max_iterations

        metadata = self.metadata.to_dict()

        model = self.model

        pending_tool_calls = []
        for pending_tool_calls_item_data in self.pending_tool_calls:
            pending_tool_calls_item = pending_tool_calls_item_data.to_dict()
            pending_tool_calls.append(pending_tool_calls_item)

        persona = self.persona

        status: str = self.status

        updated_at = self.updated_at.isoformat()

        usage = self.usage.to_dict()

        version = self.version

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "id": id,
                "max_iterations": max_iterations,
                "metadata": metadata,
                "model": model,
                "pending_tool_calls": pending_tool_calls,
                "persona": persona,
                "status": status,
                "updated_at": updated_at,
                "usage": usage,
                "version": version,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.conversation_out_metadata import ConversationOutMetadata
        from ..models.pending_tool_call import PendingToolCall
        from ..models.usage import Usage

        d = dict(src_dict)
        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        id = d.pop("id")

        max_iterations = d.pop("max_iterations")

        metadata = ConversationOutMetadata.from_dict(d.pop("metadata"))

        model = d.pop("model")

        pending_tool_calls = []
        _pending_tool_calls = d.pop("pending_tool_calls")
        for pending_tool_calls_item_data in _pending_tool_calls:
            pending_tool_calls_item = PendingToolCall.from_dict(
                pending_tool_calls_item_data
            )

            pending_tool_calls.append(pending_tool_calls_item)

        persona = d.pop("persona")

        status = check_conversation_out_status(d.pop("status"))

        updated_at = datetime.datetime.fromisoformat(d.pop("updated_at"))

        usage = Usage.from_dict(d.pop("usage"))

        version = d.pop("version")

        conversation_out = cls(
            created_at=created_at,
            id=id,
            max_iterations=max_iterations,
            metadata=metadata,
            model=model,
            pending_tool_calls=pending_tool_calls,
            persona=persona,
            status=status,
            updated_at=updated_at,
            usage=usage,
            version=version,
        )

        conversation_out.additional_properties = d
        return conversation_out

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
