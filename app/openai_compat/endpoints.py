"""HTTP face of the Chat Completions API: parse, call the chat service, shape the response.

The same Bearer key, tenants, ``Idempotency-Key`` and per-conversation lock as the native API (the
turn runs through the conversations service). A stored idempotent response is the turn, shaped
again as a completion (or, for ``stream: true``, the turn's events followed again).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from app.auth.dependencies import Tenant
from app.conversations.background import service_for
from app.conversations.endpoints import IdempotencyKey, idempotency_for, turn_event_items
from app.conversations.schemas import TurnOut
from app.events.schemas import END_TYPES, EventOut
from app.events.sse import PING_SECONDS, SEND_TIMEOUT_SECONDS
from app.events.stream import CutOff, Heartbeat
from app.kit.db import Session
from app.kit.errors import SabreError
from app.kit.openapi import problem_responses
from app.kit.routing import api_router
from app.openai_compat import schemas, service
from app.openai_compat.repository import ChatLinkRepository
from app.openai_compat.service import ChatService, History

# One event of a streamed answer (schemathesis checks each): a chunk as JSON, or `[DONE]` last.
STREAM_EVENT: Final[dict[str, Any]] = {
    "schema": {
        "description": "One server-sent event: a `chat.completion.chunk`, or `[DONE]` last.",
        "type": "object",
        "properties": {
            "data": {
                "oneOf": [
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {"$ref": "#/components/schemas/ChatCompletionChunk"},
                    },
                    {"type": "string", "const": "[DONE]"},
                ]
            }
        },
        "required": ["data"],
    }
}
# Its domain errors; 400/401/413/422/429/503 follow from its dependencies (app.kit.openapi).
CREATE_DOC: dict[int | str, dict[str, Any]] = {
    **problem_responses(404, 409, 410, 502),
    200: {
        "description": "The completion, or with `stream: true` `chat.completion.chunk`s as "
        "`text/event-stream`, ending with `data: [DONE]`.",
        "content": {"text/event-stream": STREAM_EVENT},
    },
}
CONVERSATION_HEADER: Final = "Sabre-Conversation-Id"

router = api_router(prefix="/v1", tags=["chat completions"])


def _chat(request: Request, session: Session) -> ChatService:
    resources = request.app.state.resources
    return ChatService(
        conversations=service_for(resources, session),
        links=ChatLinkRepository(session),
        personas=resources.personas,
    )


@router.post(
    "/chat/completions",
    operation_id="chat_completions.create",
    response_model=schemas.ChatCompletion,
    responses=CREATE_DOC,
)
async def create_chat_completion(
    request: Request,
    body: schemas.ChatCompletionRequest,
    tenant: Tenant,
    session: Session,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Run the persona named by `model` on the dialogue in `messages`, with `tools` as the caller's
    tools. The answer is the turn's output (`finish_reason: stop`) or the calls it waits on
    (`tool_calls`, several when the code made them at once). Send the whole dialogue each time: a
    history SABRE answered continues its conversation (the `Sabre-Conversation-Id` header names it),
    any other history starts a new one seeded with it."""
    chat = _chat(request, session)
    history = service.read_history(body)
    chat.persona_of(body.model)
    idempotency = await idempotency_for(request, tenant=tenant, key=idempotency_key)
    if idempotency is not None:
        stored = await idempotency.begin()
        if stored is not None:
            turn = TurnOut.model_validate(stored.body)
            return await _answer(
                request, chat, tenant=tenant, body=body, history=history, turn=turn, replayed=True
            )
    try:
        async with idempotency.kept_alive() if idempotency is not None else contextlib.nullcontext():
            plan = await chat.plan(tenant=tenant, body=body)
            turn = await chat.run(plan, tenant=tenant, idempotency=idempotency)
    except BaseException:
        if idempotency is not None:
            await idempotency.abandon()
        raise
    return await _answer(request, chat, tenant=tenant, body=body, history=history, turn=turn, replayed=False)


async def _answer(
    request: Request,
    chat: ChatService,
    *,
    tenant: str,
    body: schemas.ChatCompletionRequest,
    history: History,
    turn: TurnOut,
    replayed: bool,
) -> Response:
    headers = {CONVERSATION_HEADER: turn.conversation_id}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    if body.stream:
        sessionmaker = request.app.state.sessionmaker

        async def remember(ended: TurnOut) -> None:
            async with sessionmaker() as session, session.begin():
                await ChatLinkRepository(session).put(
                    tenant=tenant,
                    digest=service.answer_digest(history, ended),
                    conversation_id=ended.conversation_id,
                    version=ended.version,
                )

        items = turn_event_items(request, conversation_id=turn.conversation_id, turn_id=turn.turn_id)
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return EventSourceResponse(
            _chunks(items, turn=turn, model=body.model, include_usage=include_usage, remember=remember),
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", **headers},
            ping=PING_SECONDS,
            send_timeout=SEND_TIMEOUT_SECONDS,
        )
    answer = service.completion(turn, model=body.model)
    if replayed:
        # The link was stored with the turn; stored again in case that answer never reached the
        # client. Committed before the answer leaves: the client's next request looks it up at once
        # (the request dependency's own commit may come after the response is sent).
        await chat.remember(tenant=tenant, history=history, turn=turn)
        await chat.links.session.commit()
    return JSONResponse(answer.model_dump(mode="json"), headers=headers)


async def _chunks(
    items: AsyncIterator[EventOut | Heartbeat | CutOff],
    *,
    turn: TurnOut,
    model: str,
    include_usage: bool,
    remember: Callable[[TurnOut], Awaitable[None]],
) -> AsyncIterator[ServerSentEvent]:
    """The turn's answer as chunks: the role at once, heartbeats while it runs, then its content or
    tool calls, the finish reason, the usage (if asked for) and ``[DONE]``."""
    opening = service.opening_chunk(
        chunk_id=service.completion_id(turn), created=int(time.time()), model=model
    )
    yield ServerSentEvent(data=opening.model_dump_json(exclude_none=True))
    async for item in items:
        if isinstance(item, Heartbeat):
            yield ServerSentEvent(comment="heartbeat")
            continue
        if isinstance(item, CutOff):
            yield _error("stream_cut_off", "The stream fell too far behind; ask again.")
            return
        if item.type not in END_TYPES:
            continue
        ended = TurnOut.model_validate(item.data)
        try:
            chunks = service.chunks(ended, model=model, include_usage=include_usage)
        except SabreError as exc:
            yield _error(exc.code, exc.detail)
            return
        await remember(ended)
        for chunk in chunks:
            yield ServerSentEvent(data=chunk.model_dump_json(exclude_none=True))
        yield ServerSentEvent(data="[DONE]")
        return
    # The turn's events ended before its end: its conversation was deleted (a replay after the
    # delete, or a delete while it ran). Said, so a client does not take silence for an answer.
    yield _error("turn_gone", "The turn's conversation was deleted before its answer was sent; ask again.")


def _error(code: str, message: str) -> ServerSentEvent:
    """An error in the middle of a stream, the way OpenAI's streams carry one (the SDKs raise it)."""
    return ServerSentEvent(
        data=json.dumps({"error": {"message": message, "type": "server_error", "code": code}})
    )


@router.get("/models", operation_id="models.list", response_model=schemas.ModelList)
async def list_models(request: Request, tenant: Tenant) -> schemas.ModelList:
    """The personas, as models `sabre/<persona>` for `POST /v1/chat/completions` (append
    `:<backing model>` to run the persona on another model)."""
    return service.model_list(request.app.state.resources.personas, created=_STARTED)


_STARTED: Final = int(time.time())
