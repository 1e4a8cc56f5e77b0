from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.tool_error import ToolError
    from ..models.tool_output import ToolOutput


T = TypeVar("T", bound="ToolResults")


@_attrs_define
class ToolResults:
    """Results for the pending tool calls, exactly one per pending call.

    Attributes:
        results (list[ToolError | ToolOutput]):
        background (bool | Unset): Answer 202 with the queued Turn at once and run it on a job worker; poll `GET
            .../turns/{turn_id}` or follow `GET .../events`. With `stream`, the events are streamed. Default: False.
        stream (bool | Unset): Answer `text/event-stream`: the turn's events as they happen, ending with its end event.
            The turn keeps running if the client goes away. Default: False.
    """

    results: list[ToolError | ToolOutput]
    background: bool | Unset = False
    stream: bool | Unset = False

    def to_dict(self) -> dict[str, Any]:
        from ..models.tool_output import ToolOutput

        results = []
        for results_item_data in self.results:
            results_item: dict[str, Any]
            if isinstance(results_item_data, ToolOutput):
                results_item = results_item_data.to_dict()
            else:
                results_item = results_item_data.to_dict()

            results.append(results_item)

        background = self.background

        stream = self.stream

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "results": results,
            }
        )
        if background is not UNSET:
            field_dict["background"] = background
        if stream is not UNSET:
            field_dict["stream"] = stream

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.tool_error import ToolError
        from ..models.tool_output import ToolOutput

        d = dict(src_dict)
        results = []
        _results = d.pop("results")
        for results_item_data in _results:

            def _parse_results_item(data: object) -> ToolError | ToolOutput:
                try:
                    if not isinstance(data, dict):
                        raise TypeError()
                    results_item_type_0 = ToolOutput.from_dict(data)

                    return results_item_type_0
                except (TypeError, ValueError, AttributeError, KeyError):
                    pass
                if not isinstance(data, dict):
                    raise TypeError()
                results_item_type_1 = ToolError.from_dict(data)

                return results_item_type_1

            results_item = _parse_results_item(results_item_data)

            results.append(results_item)

        background = d.pop("background", UNSET)

        stream = d.pop("stream", UNSET)

        tool_results = cls(
            results=results,
            background=background,
            stream=stream,
        )

        return tool_results
