from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.chat_tool import ChatTool
    from ..models.create_conversation_metadata import CreateConversationMetadata
    from ..models.history_assistant import HistoryAssistant
    from ..models.history_user import HistoryUser
    from ..models.responses_tool import ResponsesTool


T = TypeVar("T", bound="CreateConversation")


@_attrs_define
class CreateConversation:
    """Start a conversation and run its first turn.

    Attributes:
        background (bool | Unset): Answer 202 with the queued Turn at once and run it on a job worker; poll `GET
            .../turns/{turn_id}` or follow `GET .../events`. With `stream`, the events are streamed. Default: False.
        input_ (None | str | Unset): The user's message. Required unless `messages` is given: without it, the model
            continues from the history, which then ends with a user or `tool` message.
        instructions (None | str | Unset): Extra system instructions for this conversation.
        max_iterations (int | None | Unset): Model calls per turn before it fails.
        messages (list[Any | HistoryAssistant | HistoryUser] | Unset): A dialogue the conversation starts from, before
            `input`: user and assistant messages, an assistant's `tool_calls` and a `tool` message answering each, right
            after it. Stored as the start of the transcript; the model sees the calls as a block and its results.
        metadata (CreateConversationMetadata | Unset): Free-form labels, returned as given: keys up to 64 characters,
            strings up to 512, numbers in the 64-bit integer range.
        model (None | str | Unset): Override the model.
        persona (str | Unset): Persona name. Default: 'default'.
        stream (bool | Unset): Answer `text/event-stream`: the turn's events as they happen, ending with its end event.
            The turn keeps running if the client goes away. Default: False.
        tools (list[ChatTool | ResponsesTool] | Unset): External tools the caller runs: calling one pauses the turn with
            pending_tool_calls.
        webhook_url (None | str | Unset): POST the end of every turn here (turn.completed, turn.awaiting_tool_results,
            turn.failed, turn.cancelled), signed the Standard Webhooks way with the tenant's secret; unset: the tenant's
            default, if any. An http or https URL without credentials; a private or loopback address is refused at delivery
            unless the server allows it.
    """

    background: bool | Unset = False
    input_: None | str | Unset = UNSET
    instructions: None | str | Unset = UNSET
    max_iterations: int | None | Unset = UNSET
    messages: list[Any | HistoryAssistant | HistoryUser] | Unset = UNSET
    metadata: CreateConversationMetadata | Unset = UNSET
    model: None | str | Unset = UNSET
    persona: str | Unset = "default"
    stream: bool | Unset = False
    tools: list[ChatTool | ResponsesTool] | Unset = UNSET
    webhook_url: None | str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.history_assistant import HistoryAssistant
        from ..models.history_user import HistoryUser
        from ..models.responses_tool import ResponsesTool

        background = self.background

        input_: None | str | Unset
        if isinstance(self.input_, Unset):
            input_ = UNSET
        else:
            input_ = self.input_

        instructions: None | str | Unset
        if isinstance(self.instructions, Unset):
            instructions = UNSET
        else:
            instructions = self.instructions

        max_iterations: int | None | Unset
        if isinstance(self.max_iterations, Unset):
            max_iterations = UNSET
        else:
            max_iterations = self.max_iterations

        messages: list[Any | dict[str, Any]] | Unset = UNSET
        if not isinstance(self.messages, Unset):
            messages = []
            for messages_item_data in self.messages:
                messages_item: Any | dict[str, Any]
                if isinstance(messages_item_data, HistoryUser) or isinstance(
                    messages_item_data, HistoryAssistant
                ):
                    messages_item = messages_item_data.to_dict()
                else:
                    messages_item = messages_item_data
                messages.append(messages_item)

        metadata: dict[str, Any] | Unset = UNSET
        if not isinstance(self.metadata, Unset):
            metadata = self.metadata.to_dict()

        model: None | str | Unset
        if isinstance(self.model, Unset):
            model = UNSET
        else:
            model = self.model

        persona = self.persona

        stream = self.stream

        tools: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.tools, Unset):
            tools = []
            for tools_item_data in self.tools:
                tools_item: dict[str, Any]
                if isinstance(tools_item_data, ResponsesTool):
                    tools_item = tools_item_data.to_dict()
                else:
                    tools_item = tools_item_data.to_dict()

                tools.append(tools_item)

        webhook_url: None | str | Unset
        if isinstance(self.webhook_url, Unset):
            webhook_url = UNSET
        else:
            webhook_url = self.webhook_url

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if background is not UNSET:
            field_dict["background"] = background
        if input_ is not UNSET:
            field_dict["input"] = input_
        if instructions is not UNSET:
            field_dict["instructions"] = instructions
        if max_iterations is not UNSET:
            field_dict["max_iterations"] = max_iterations
        if messages is not UNSET:
            field_dict["messages"] = messages
        if metadata is not UNSET:
            field_dict["metadata"] = metadata
        if model is not UNSET:
            field_dict["model"] = model
        if persona is not UNSET:
            field_dict["persona"] = persona
        if stream is not UNSET:
            field_dict["stream"] = stream
        if tools is not UNSET:
            field_dict["tools"] = tools
        if webhook_url is not UNSET:
            field_dict["webhook_url"] = webhook_url

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.chat_tool import ChatTool
        from ..models.create_conversation_metadata import CreateConversationMetadata
        from ..models.history_assistant import HistoryAssistant
        from ..models.history_user import HistoryUser
        from ..models.responses_tool import ResponsesTool

        d = dict(src_dict)
        background = d.pop("background", UNSET)

        def _parse_input_(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        input_ = _parse_input_(d.pop("input", UNSET))

        def _parse_instructions(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        instructions = _parse_instructions(d.pop("instructions", UNSET))

        def _parse_max_iterations(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        max_iterations = _parse_max_iterations(d.pop("max_iterations", UNSET))

        _messages = d.pop("messages", UNSET)
        messages: list[Any | HistoryAssistant | HistoryUser] | Unset = UNSET
        if _messages is not UNSET:
            messages = []
            for messages_item_data in _messages:

                def _parse_messages_item(
                    data: object,
                ) -> Any | HistoryAssistant | HistoryUser:
                    try:
                        if not isinstance(data, dict):
                            raise TypeError()
                        messages_item_type_0 = HistoryUser.from_dict(data)

                        return messages_item_type_0
                    except (TypeError, ValueError, AttributeError, KeyError):
                        pass
                    try:
                        if not isinstance(data, dict):
                            raise TypeError()
                        messages_item_type_1 = HistoryAssistant.from_dict(data)

                        return messages_item_type_1
                    except (TypeError, ValueError, AttributeError, KeyError):
                        pass
                    return cast(Any | HistoryAssistant | HistoryUser, data)

                messages_item = _parse_messages_item(messages_item_data)

                messages.append(messages_item)

        _metadata = d.pop("metadata", UNSET)
        metadata: CreateConversationMetadata | Unset
        if isinstance(_metadata, Unset):
            metadata = UNSET
        else:
            metadata = CreateConversationMetadata.from_dict(_metadata)

        def _parse_model(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        model = _parse_model(d.pop("model", UNSET))

        persona = d.pop("persona", UNSET)

        stream = d.pop("stream", UNSET)

        _tools = d.pop("tools", UNSET)
        tools: list[ChatTool | ResponsesTool] | Unset = UNSET
        if _tools is not UNSET:
            tools = []
            for tools_item_data in _tools:

                def _parse_tools_item(data: object) -> ChatTool | ResponsesTool:
                    try:
                        if not isinstance(data, dict):
                            raise TypeError()
                        tools_item_type_0 = ResponsesTool.from_dict(data)

                        return tools_item_type_0
                    except (TypeError, ValueError, AttributeError, KeyError):
                        pass
                    if not isinstance(data, dict):
                        raise TypeError()
                    tools_item_type_1 = ChatTool.from_dict(data)

                    return tools_item_type_1

                tools_item = _parse_tools_item(tools_item_data)

                tools.append(tools_item)

        def _parse_webhook_url(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        webhook_url = _parse_webhook_url(d.pop("webhook_url", UNSET))

        create_conversation = cls(
            background=background,
            input_=input_,
            instructions=instructions,
            max_iterations=max_iterations,
            messages=messages,
            metadata=metadata,
            model=model,
            persona=persona,
            stream=stream,
            tools=tools,
            webhook_url=webhook_url,
        )

        return create_conversation
