"""The rules of the Chat Completions face: which conversation a history continues, and how a turn
answers in the Chat Completions shape. The turn itself is the conversations service's.

A Chat Completions client sends the whole dialogue every time. SABRE keeps, per tenant, the digest
of every dialogue it answered (the request's messages, then its own answer) with the conversation
and the version that answer left it at (``ChatLink``). A request is split at its last assistant
message: when the digest of everything up to it is linked to a conversation still at that version,
the request continues it (the messages after it are the next user message, or the results of the
pending calls); otherwise it starts a new conversation seeded with the whole history. So an edited,
reordered or forked history never mixes into a conversation that answered something else: it
starts its own.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import ValidationError

from app.conversations import schemas as conv
from app.conversations.service import ConversationService, InvalidHistory
from app.kit import json_body
from app.kit.errors import Conflict, NotFound, SabreError, Unprocessable
from app.kit.idempotency import Idempotency
from app.models import Conversation
from app.openai_compat import schemas
from app.openai_compat.repository import ChatLinkRepository
from app.personas.models import Persona
from app.runtime.protocol import canonical_json as canonical

MODEL_PREFIX = "sabre/"
_DIGEST_VERSION = "sabre-chat/1"


class UnknownModel(NotFound):
    code = "model_not_found"
    title = "Unknown model"


class InvalidChat(Unprocessable):
    code = "invalid_chat_request"
    title = "Invalid chat request"


class TurnFailed(SabreError):
    """The turn ran and failed (the model's provider, a limit): the answer is an error, not a message."""

    status = 502
    code = "turn_failed"
    title = "The turn failed"


class TurnCancelled(Conflict):
    code = "turn_cancelled"
    title = "The turn was cancelled"


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of a chat history, normalised: what its digest covers."""

    role: Literal["user", "assistant", "tool"]
    text: str = ""
    tool_calls: tuple[tuple[str, str, Any], ...] = ()  # (id, name, arguments as JSON values)
    tool_call_id: str = ""

    def canonical(self) -> str:
        return canonical([self.role, self.text, [list(c) for c in self.tool_calls], self.tool_call_id])


@dataclass(slots=True)
class History:
    """A request's dialogue: the instructions, the messages, and their digests (``digests[i]`` covers
    the instructions and messages ``0..i``; ``seed`` covers the model and the instructions)."""

    model: str
    instructions: str | None
    entries: list[Entry]
    seed: str
    digests: list[str] = field(default_factory=list)

    @property
    def last_assistant(self) -> int:
        """The index of the last assistant message, -1 without one."""
        return next(
            (i for i in range(len(self.entries) - 1, -1, -1) if self.entries[i].role == "assistant"), -1
        )

    @property
    def digest(self) -> str:
        """The digest of the whole history."""
        return self.digests[-1] if self.digests else self.seed


def _chain(previous: str, entry: Entry) -> str:
    return hashlib.sha256(f"{previous}\n{entry.canonical()}".encode()).hexdigest()


def _text(content: schemas.Content | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


def _decoded(text: str, *, where: str) -> Any:
    """JSON text as values, as strictly as a request body (finite numbers, bounded depth: else a
    422 naming ``where``); ``ValueError`` when it is not JSON at all."""
    try:
        return json_body.loads(text)
    except Unprocessable as exc:
        raise InvalidChat(f"{where}: {exc.detail}") from None


def _arguments(raw: str, *, where: str) -> Any:
    """A tool call's arguments as JSON values (the raw string when it is not JSON)."""
    if not raw.strip():
        return {}
    try:
        return _decoded(raw, where=where)
    except ValueError:
        return raw


def tool_output(text: str, *, where: str = "messages") -> Any:
    """A ``tool`` message's content as the code gets it: a JSON object or array decoded, anything
    else (a plain string, a number written as text) as the string itself."""
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            return _decoded(stripped, where=where)
        except ValueError:
            pass
    return text


def read_history(body: schemas.ChatCompletionRequest) -> History:
    """The request's dialogue, normalised and digested; 422 for a system message after the start."""
    instructions: list[str] = []
    entries: list[Entry] = []
    for index, message in enumerate(body.messages):
        if isinstance(message, schemas.SystemMessage):
            if entries:
                raise InvalidChat(
                    f"messages.{index}: system and developer messages come first, before the dialogue."
                )
            instructions.append(_text(message.content))
        elif isinstance(message, schemas.UserMessage):
            entries.append(Entry(role="user", text=_text(message.content)))
        elif isinstance(message, schemas.AssistantMessage):
            calls = tuple(
                (call.id, call.function.name, _arguments(call.function.arguments, where=f"messages.{index}"))
                for call in message.tool_calls or ()
            )
            entries.append(Entry(role="assistant", text=_text(message.content), tool_calls=calls))
        else:
            entries.append(Entry(role="tool", text=_text(message.content), tool_call_id=message.tool_call_id))
    joined = "\n\n".join(instructions) if instructions else None
    seed = hashlib.sha256(canonical([_DIGEST_VERSION, body.model, joined]).encode()).hexdigest()
    history = History(model=body.model, instructions=joined, entries=entries, seed=seed)
    previous = seed
    for entry in entries:
        previous = _chain(previous, entry)
        history.digests.append(previous)
    return history


def answer_entry(turn: conv.TurnOut) -> Entry:
    """The assistant message a turn answers with, as the client will send it back."""
    if turn.status == "awaiting_tool_results":
        return Entry(
            role="assistant", tool_calls=tuple((p.id, p.name, p.arguments) for p in turn.pending_tool_calls)
        )
    return Entry(role="assistant", text=turn.output or "")


def answer_digest(history: History, turn: conv.TurnOut) -> str:
    """The digest of the history followed by the turn's answer: what the next request continues."""
    return _chain(history.digest, answer_entry(turn))


@dataclass(slots=True)
class Plan:
    """What a request does: continue ``conversation`` (a message or tool results) or create one."""

    history: History
    create: conv.CreateConversation | None = None
    conversation: Conversation | None = None
    message: conv.PostMessage | None = None
    results: conv.ToolResults | None = None


@dataclass(slots=True)
class ChatService:
    """One request's view of the Chat Completions face, over the conversations service."""

    conversations: ConversationService
    links: ChatLinkRepository
    personas: dict[str, Persona]

    def persona_of(self, model: str) -> tuple[Persona, str | None]:
        """``sabre/<persona>[:<backing model>]`` as the persona and the backing model; 404 for an
        unknown persona, 422 for a backing model name longer than a conversation may name."""
        name, _, backing = model.removeprefix(MODEL_PREFIX).partition(":")
        persona = self.personas.get(name) if model.startswith(MODEL_PREFIX) else None
        if persona is None:
            known = ", ".join(MODEL_PREFIX + n for n in sorted(self.personas))
            raise UnknownModel(f"model: no model {model!r}; the models are {known} (GET /v1/models).")
        if len(backing) > conv.MAX_MODEL_CHARS:
            raise InvalidChat(f"model: a backing model's name is at most {conv.MAX_MODEL_CHARS} characters.")
        return persona, backing or None

    async def plan(self, *, tenant: str, body: schemas.ChatCompletionRequest) -> Plan:
        """Find the conversation the history continues, or plan a new one seeded with it."""
        persona, backing = self.persona_of(body.model)
        history = read_history(body)
        split = history.last_assistant
        tail = history.entries[split + 1 :]
        if not tail:
            raise InvalidChat(
                "messages: the last message must be a user or tool message, for the model to answer."
            )
        roles = {entry.role for entry in tail}
        if len(roles) > 1:
            raise InvalidChat(
                "messages: after the last assistant message come user messages or tool messages, not both."
            )
        if split >= 0:
            conversation = await self.links.conversation(tenant=tenant, digest=history.digests[split])
            if conversation is not None:
                plan = Plan(history=history, conversation=conversation)
                if roles == {"tool"}:
                    plan.results = _validated(
                        conv.ToolResults,
                        {
                            "results": [
                                {
                                    "tool_call_id": entry.tool_call_id,
                                    "output": tool_output(
                                        entry.text, where=f"the result of {entry.tool_call_id}"
                                    ),
                                }
                                for entry in tail
                            ],
                            "stream": body.stream,
                        },
                    )
                else:
                    plan.message = _validated(
                        conv.PostMessage,
                        {
                            "input": "\n\n".join(entry.text for entry in tail),
                            "tools": [t.model_dump(exclude_none=True) for t in body.tools] or None,
                            "stream": body.stream,
                        },
                    )
                return plan
        seeded = history.entries if roles == {"tool"} else history.entries[: split + 1]
        create = _validated(
            conv.CreateConversation,
            {
                "persona": persona.name,
                "model": backing,
                "instructions": history.instructions,
                "tools": [t.model_dump(exclude_none=True) for t in body.tools],
                # An empty assistant message (an answer of no words) says nothing: it is left out.
                "messages": [
                    _history_message(entry)
                    for entry in seeded
                    if entry.role != "assistant" or entry.text.strip() or entry.tool_calls
                ],
                "input": None if roles == {"tool"} else "\n\n".join(entry.text for entry in tail),
                "stream": body.stream,
            },
        )
        return Plan(history=history, create=create)

    async def run(self, plan: Plan, *, tenant: str, idempotency: Idempotency | None) -> conv.TurnOut:
        """Run the planned turn (waited for, or started detached for a stream). A waited-for turn's
        answer is linked in the transaction that stores the turn."""

        async def link(turn: conv.TurnOut) -> None:
            await self.remember(tenant=tenant, history=plan.history, turn=turn)

        self.conversations.on_stored = link
        if plan.create is not None:
            return await self.conversations.create(tenant=tenant, body=plan.create, idempotency=idempotency)
        conversation = plan.conversation
        assert conversation is not None
        if plan.results is not None:
            return await self.conversations.submit_tool_results(
                conversation, body=plan.results, idempotency=idempotency
            )
        assert plan.message is not None
        return await self.conversations.post_message(conversation, body=plan.message, idempotency=idempotency)

    async def remember(self, *, tenant: str, history: History, turn: conv.TurnOut) -> None:
        """Link the history followed by the turn's answer to the conversation and its version."""
        if turn.status not in ("completed", "awaiting_tool_results"):
            return
        await self.links.put(
            tenant=tenant,
            digest=answer_digest(history, turn),
            conversation_id=turn.conversation_id,
            version=turn.version,
        )


def _history_message(entry: Entry) -> dict[str, Any]:
    if entry.role == "user":
        return {"role": "user", "content": entry.text}
    if entry.role == "tool":
        output = tool_output(entry.text, where=f"the result of {entry.tool_call_id}")
        return {"role": "tool", "tool_call_id": entry.tool_call_id, "output": output}
    message: dict[str, Any] = {"role": "assistant", "content": entry.text or None}
    if entry.tool_calls:
        message["tool_calls"] = [
            {"id": call_id, "name": name, "arguments": arguments}
            for call_id, name, arguments in entry.tool_calls
        ]
    return message


M = TypeVar("M", bound=conv.TurnRequest)


def _validated(model: type[M], data: dict[str, Any]) -> M:
    """``model`` from ``data``, a 422 naming the first problem (the history is the client's input)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise InvalidHistory(
            f"{where}: {error['msg']}" if where else str(error["msg"]),
            extra={"errors": [{"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]}]},
        ) from None


# -- the answer ------------------------------------------------------------------------------------


def ended(turn: conv.TurnOut) -> None:
    """Raise the error a failed or cancelled turn answers with."""
    if turn.status == "cancelled":
        raise TurnCancelled("The turn was cancelled before it answered.", extra={"current": _current(turn)})
    if turn.status == "failed":
        message = turn.error.message if turn.error is not None else "the turn failed"
        raise TurnFailed(message, extra={"current": _current(turn)})


def _current(turn: conv.TurnOut) -> dict[str, Any]:
    return {
        "conversation_id": turn.conversation_id,
        "turn_id": turn.turn_id,
        "error": turn.error.model_dump() if turn.error is not None else None,
    }


def completion_id(turn: conv.TurnOut) -> str:
    return f"chatcmpl-{turn.turn_id}"


def created_at(turn: conv.TurnOut) -> int:
    return int(turn.created_at.timestamp()) if turn.created_at is not None else int(time.time())


def usage(turn: conv.TurnOut) -> schemas.CompletionUsage:
    return schemas.CompletionUsage(
        prompt_tokens=turn.usage.input_tokens,
        completion_tokens=turn.usage.output_tokens,
        total_tokens=turn.usage.input_tokens + turn.usage.output_tokens,
    )


def tool_calls(turn: conv.TurnOut) -> list[schemas.ResponseToolCall]:
    return [
        schemas.ResponseToolCall(
            id=p.id,
            function=schemas.ResponseFunction(
                name=p.name, arguments=json.dumps(p.arguments, ensure_ascii=False)
            ),
        )
        for p in turn.pending_tool_calls
    ]


def completion(turn: conv.TurnOut, *, model: str) -> schemas.ChatCompletion:
    """A turn that completed or paused, as a chat completion."""
    ended(turn)
    paused = turn.status == "awaiting_tool_results"
    message = (
        schemas.ResponseMessage(content=None, tool_calls=tool_calls(turn))
        if paused
        else schemas.ResponseMessage(content=turn.output or "")
    )
    return schemas.ChatCompletion(
        id=completion_id(turn),
        created=created_at(turn),
        model=model,
        choices=[schemas.Choice(message=message, finish_reason="tool_calls" if paused else "stop")],
        usage=usage(turn),
    )


def chunks(turn: conv.TurnOut, *, model: str, include_usage: bool) -> Sequence[schemas.ChatCompletionChunk]:
    """The chunks that carry a finished turn's answer (after the opening one with the role)."""
    ended(turn)

    def chunk(
        delta: schemas.ChunkDelta, finish: schemas.FinishReason | None = None
    ) -> schemas.ChatCompletionChunk:
        return schemas.ChatCompletionChunk(
            id=completion_id(turn),
            created=created_at(turn),
            model=model,
            choices=[schemas.ChunkChoice(delta=delta, finish_reason=finish)],
        )

    out: list[schemas.ChatCompletionChunk] = []
    if turn.status == "awaiting_tool_results":
        for index, call in enumerate(tool_calls(turn)):
            out.append(
                chunk(
                    schemas.ChunkDelta(
                        tool_calls=[
                            schemas.ChunkToolCall(
                                index=index,
                                id=call.id,
                                type="function",
                                function=schemas.ChunkFunction(
                                    name=call.function.name, arguments=call.function.arguments
                                ),
                            )
                        ]
                    )
                )
            )
        out.append(chunk(schemas.ChunkDelta(), "tool_calls"))
    else:
        if turn.output:
            out.append(chunk(schemas.ChunkDelta(content=turn.output)))
        out.append(chunk(schemas.ChunkDelta(), "stop"))
    if include_usage:
        out.append(
            schemas.ChatCompletionChunk(
                id=completion_id(turn), created=created_at(turn), model=model, choices=[], usage=usage(turn)
            )
        )
    return out


def opening_chunk(*, chunk_id: str, created: int, model: str) -> schemas.ChatCompletionChunk:
    """The first chunk of a stream, sent at once: the assistant's role, no content yet."""
    return schemas.ChatCompletionChunk(
        id=chunk_id,
        created=created,
        model=model,
        choices=[schemas.ChunkChoice(delta=schemas.ChunkDelta(role="assistant", content=""))],
    )


def model_list(personas: dict[str, Persona], *, created: int) -> schemas.ModelList:
    """Every persona as a model ``sabre/<persona>``."""
    return schemas.ModelList(
        data=[schemas.Model(id=MODEL_PREFIX + name, created=created) for name in sorted(personas)]
    )
