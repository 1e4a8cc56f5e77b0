from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.chat_tool import ChatTool
    from ..models.responses_tool import ResponsesTool


T = TypeVar("T", bound="PostMessage")


@_attrs_define
class PostMessage:
    """The next user message.

    Attributes:
        input_ (str): The user's message.
        background (bool | Unset): Answer 202 with the queued Turn at once and run it on a job worker; poll `GET
            .../turns/{turn_id}` or follow `GET .../events`. With `stream`, the events are streamed. Default: False.
        stream (bool | Unset): Answer `text/event-stream`: the turn's events as they happen, ending with its end event.
            The turn keeps running if the client goes away. Default: False.
        tools (list[ChatTool | ResponsesTool] | None | Unset): Add or replace external tools (by name) from this message
            on.
    """

    input_: str
    background: bool | Unset = False
    stream: bool | Unset = False
    tools: list[ChatTool | ResponsesTool] | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.responses_tool import ResponsesTool

        input_ = self.input_

        background = self.background

        stream = self.stream

        tools: list[dict[str, Any]] | None | Unset
        if isinstance(self.tools, Unset):
            tools = UNSET
        elif isinstance(self.tools, list):
            tools = []
            for tools_type_0_item_data in self.tools:
                tools_type_0_item: dict[str, Any]
                if isinstance(tools_type_0_item_data, ResponsesTool):
                    tools_type_0_item = tools_type_0_item_data.to_dict()
                else:
                    tools_type_0_item = tools_type_0_item_data.to_dict()

                tools.append(tools_type_0_item)

        else:
            tools = self.tools

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "input": input_,
            }
        )
        if background is not UNSET:
            field_dict["background"] = background
        if stream is not UNSET:
            field_dict["stream"] = stream
        if tools is not UNSET:
            field_dict["tools"] = tools

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.chat_tool import ChatTool
        from ..models.responses_tool import ResponsesTool

        d = dict(src_dict)
        input_ = d.pop("input")

        background = d.pop("background", UNSET)

        stream = d.pop("stream", UNSET)

        def _parse_tools(data: object) -> list[ChatTool | ResponsesTool] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                tools_type_0 = []
                _tools_type_0 = data
                for tools_type_0_item_data in _tools_type_0:

                    def _parse_tools_type_0_item(
                        data: object,
                    ) -> ChatTool | ResponsesTool:
                        try:
                            if not isinstance(data, dict):
                                raise TypeError()
                            tools_type_0_item_type_0 = ResponsesTool.from_dict(data)

                            return tools_type_0_item_type_0
                        except (TypeError, ValueError, AttributeError, KeyError):
                            pass
                        if not isinstance(data, dict):
                            raise TypeError()
                        tools_type_0_item_type_1 = ChatTool.from_dict(data)

                        return tools_type_0_item_type_1

                    tools_type_0_item = _parse_tools_type_0_item(tools_type_0_item_data)

                    tools_type_0.append(tools_type_0_item)

                return tools_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[ChatTool | ResponsesTool] | None | Unset, data)

        tools = _parse_tools(d.pop("tools", UNSET))

        post_message = cls(
            input_=input_,
            background=background,
            stream=stream,
            tools=tools,
        )

        return post_message
