"""Contains all the data models used in inputs/outputs"""

from .assistant_message import AssistantMessage
from .chat_completion import ChatCompletion
from .chat_completion_chunk import ChatCompletionChunk
from .chat_completion_request import ChatCompletionRequest
from .chat_completion_request_metadata_type_0 import ChatCompletionRequestMetadataType0
from .chat_text_part import ChatTextPart
from .chat_tool import ChatTool
from .choice import Choice
from .choice_finish_reason import ChoiceFinishReason
from .chunk_choice import ChunkChoice
from .chunk_choice_finish_reason_type_0 import ChunkChoiceFinishReasonType0
from .chunk_delta import ChunkDelta
from .chunk_function import ChunkFunction
from .chunk_tool_call import ChunkToolCall
from .completion_usage import CompletionUsage
from .conversation_list import ConversationList
from .conversation_out import ConversationOut
from .conversation_out_metadata import ConversationOutMetadata
from .conversation_out_status import ConversationOutStatus
from .conversations_list_metadata import ConversationsListMetadata
from .conversations_list_status import ConversationsListStatus
from .create_conversation import CreateConversation
from .create_conversation_metadata import CreateConversationMetadata
from .custom_tool_out import CustomToolOut
from .custom_tool_out_execution_mode import CustomToolOutExecutionMode
from .custom_tool_out_implementation_type_0 import CustomToolOutImplementationType0
from .custom_tool_out_parameters import CustomToolOutParameters
from .custom_tool_out_runs import CustomToolOutRuns
from .event_list import EventList
from .event_out import EventOut
from .event_out_data import EventOutData
from .event_out_type import EventOutType
from .function_call import FunctionCall
from .function_definition import FunctionDefinition
from .function_definition_parameters_type_0 import FunctionDefinitionParametersType0
from .health import Health
from .helpers_part import HelpersPart
from .helpers_result_part import HelpersResultPart
from .helpers_result_part_status import HelpersResultPartStatus
from .history_assistant import HistoryAssistant
from .history_tool_call import HistoryToolCall
from .history_tool_call_arguments import HistoryToolCallArguments
from .history_user import HistoryUser
from .message_list import MessageList
from .message_out import MessageOut
from .message_out_role import MessageOutRole
from .model import Model
from .model_list import ModelList
from .patch_conversation import PatchConversation
from .patch_conversation_metadata import PatchConversationMetadata
from .pending_tool_call import PendingToolCall
from .pending_tool_call_arguments import PendingToolCallArguments
from .persona_detail import PersonaDetail
from .persona_limits import PersonaLimits
from .persona_list import PersonaList
from .persona_network import PersonaNetwork
from .persona_summary import PersonaSummary
from .post_message import PostMessage
from .problem import Problem
from .problem_current_type_0 import ProblemCurrentType0
from .problem_errors_type_0_item import ProblemErrorsType0Item
from .readiness import Readiness
from .readiness_checks import ReadinessChecks
from .response_function import ResponseFunction
from .response_message import ResponseMessage
from .response_tool_call import ResponseToolCall
from .responses_tool import ResponsesTool
from .responses_tool_parameters_type_0 import ResponsesToolParametersType0
from .stream_options import StreamOptions
from .system_message import SystemMessage
from .system_message_role import SystemMessageRole
from .text_part import TextPart
from .tool_call import ToolCall
from .tool_call_part import ToolCallPart
from .tool_call_part_arguments import ToolCallPartArguments
from .tool_error import ToolError
from .tool_message import ToolMessage
from .tool_output import ToolOutput
from .tool_result_part import ToolResultPart
from .tool_results import ToolResults
from .tool_returns_out import ToolReturnsOut
from .turn_error_body import TurnErrorBody
from .turn_list import TurnList
from .turn_out import TurnOut
from .turn_out_status import TurnOutStatus
from .usage import Usage
from .user_message import UserMessage

__all__ = (
    "AssistantMessage",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatCompletionRequestMetadataType0",
    "ChatTextPart",
    "ChatTool",
    "Choice",
    "ChoiceFinishReason",
    "ChunkChoice",
    "ChunkChoiceFinishReasonType0",
    "ChunkDelta",
    "ChunkFunction",
    "ChunkToolCall",
    "CompletionUsage",
    "ConversationList",
    "ConversationOut",
    "ConversationOutMetadata",
    "ConversationOutStatus",
    "ConversationsListMetadata",
    "ConversationsListStatus",
    "CreateConversation",
    "CreateConversationMetadata",
    "CustomToolOut",
    "CustomToolOutExecutionMode",
    "CustomToolOutImplementationType0",
    "CustomToolOutParameters",
    "CustomToolOutRuns",
    "EventList",
    "EventOut",
    "EventOutData",
    "EventOutType",
    "FunctionCall",
    "FunctionDefinition",
    "FunctionDefinitionParametersType0",
    "Health",
    "HelpersPart",
    "HelpersResultPart",
    "HelpersResultPartStatus",
    "HistoryAssistant",
    "HistoryToolCall",
    "HistoryToolCallArguments",
    "HistoryUser",
    "MessageList",
    "MessageOut",
    "MessageOutRole",
    "Model",
    "ModelList",
    "PatchConversation",
    "PatchConversationMetadata",
    "PendingToolCall",
    "PendingToolCallArguments",
    "PersonaDetail",
    "PersonaLimits",
    "PersonaList",
    "PersonaNetwork",
    "PersonaSummary",
    "PostMessage",
    "Problem",
    "ProblemCurrentType0",
    "ProblemErrorsType0Item",
    "Readiness",
    "ReadinessChecks",
    "ResponseFunction",
    "ResponseMessage",
    "ResponseToolCall",
    "ResponsesTool",
    "ResponsesToolParametersType0",
    "StreamOptions",
    "SystemMessage",
    "SystemMessageRole",
    "TextPart",
    "ToolCall",
    "ToolCallPart",
    "ToolCallPartArguments",
    "ToolError",
    "ToolMessage",
    "ToolOutput",
    "ToolResultPart",
    "ToolResults",
    "ToolReturnsOut",
    "TurnErrorBody",
    "TurnList",
    "TurnOut",
    "TurnOutStatus",
    "Usage",
    "UserMessage",
)
