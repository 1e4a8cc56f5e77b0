from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.turn_out_status import TurnOutStatus, check_turn_out_status

if TYPE_CHECKING:
    from ..models.pending_tool_call import PendingToolCall
    from ..models.turn_error_body import TurnErrorBody
    from ..models.usage import Usage


T = TypeVar("T", bound="TurnOut")


@_attrs_define
class TurnOut:
    """The result of one turn.

    Attributes:
        background (bool):  Default: False.
        cancel_requested (bool):  Default: False.
        conversation_id (str):
        created_at (datetime.datetime | None):
        error (None | TurnErrorBody):
        finished_at (datetime.datetime | None):
        output (None | str):
        pending_tool_calls (list[PendingToolCall]):
        status (TurnOutStatus):
        turn_id (str):
        usage (Usage): Token and call totals: a turn's running ones (all LLM calls, the loop's and the helpers'), as
            stored with the turn and as the API shows them for a turn or a conversation.
        version (int): The conversation's version after the turn (before it, while it runs).
        warnings (list[str]):
    """

    conversation_id: str
    created_at: datetime.datetime | None
    error: None | TurnErrorBody
    finished_at: datetime.datetime | None
    output: None | str
    pending_tool_calls: list[PendingToolCall]
    status: TurnOutStatus
    turn_id: str
    usage: Usage
    version: int
    warnings: list[str]
    background: bool = False
    cancel_requested: bool = False
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.turn_error_body import TurnErrorBody

        background = self.background

        cancel_requested = self.cancel_requested

        conversation_id = self.conversation_id

        created_at: None | str
        if isinstance(self.created_at, datetime.datetime):
            created_at = self.created_at.isoformat()
        else:
            created_at = self.created_at

        error: dict[str, Any] | None
        if isinstance(self.error, TurnErrorBody):
            error = self.error.to_dict()
        else:
            error = self.error

        finished_at: None | str
        if isinstance(self.finished_at, datetime.datetime):
            finished_at = self.finished_at.isoformat()
        else:
            finished_at = self.finished_at

        output: None | str
        output = self.output

        pending_tool_calls = []
        for pending_tool_calls_item_data in self.pending_tool_calls:
            pending_tool_calls_item = pending_tool_calls_item_data.to_dict()
            pending_tool_calls.append(pending_tool_calls_item)

        status: str = self.status

        turn_id = self.turn_id

        usage = self.usage.to_dict()

        version = self.version

        warnings = self.warnings

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "background": background,
                "cancel_requested": cancel_requested,
                "conversation_id": conversation_id,
                "created_at": created_at,
                "error": error,
                "finished_at": finished_at,
                "output": output,
                "pending_tool_calls": pending_tool_calls,
                "status": status,
                "turn_id": turn_id,
                "usage": usage,
                "version": version,
                "warnings": warnings,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.pending_tool_call import PendingToolCall
        from ..models.turn_error_body import TurnErrorBody
        from ..models.usage import Usage

        d = dict(src_dict)
        background = d.pop("background")

        cancel_requested = d.pop("cancel_requested")

        conversation_id = d.pop("conversation_id")

        def _parse_created_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                created_at_type_0 = datetime.datetime.fromisoformat(data)

                return created_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        created_at = _parse_created_at(d.pop("created_at"))

        def _parse_error(data: object) -> None | TurnErrorBody:
            if data is None:
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                error_type_0 = TurnErrorBody.from_dict(data)

                return error_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | TurnErrorBody, data)

        error = _parse_error(d.pop("error"))

        def _parse_finished_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                finished_at_type_0 = datetime.datetime.fromisoformat(data)

                return finished_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        finished_at = _parse_finished_at(d.pop("finished_at"))

        def _parse_output(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        output = _parse_output(d.pop("output"))

        pending_tool_calls = []
        _pending_tool_calls = d.pop("pending_tool_calls")
        for pending_tool_calls_item_data in _pending_tool_calls:
            pending_tool_calls_item = PendingToolCall.from_dict(
                pending_tool_calls_item_data
            )

            pending_tool_calls.append(pending_tool_calls_item)

        status = check_turn_out_status(d.pop("status"))

        turn_id = d.pop("turn_id")

        usage = Usage.from_dict(d.pop("usage"))

        version = d.pop("version")

        warnings = cast(list[str], d.pop("warnings"))

        turn_out = cls(
            background=background,
            cancel_requested=cancel_requested,
            conversation_id=conversation_id,
            created_at=created_at,
            error=error,
            finished_at=finished_at,
            output=output,
            pending_tool_calls=pending_tool_calls,
            status=status,
            turn_id=turn_id,
            usage=usage,
            version=version,
            warnings=warnings,
        )

        turn_out.additional_properties = d
        return turn_out

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
