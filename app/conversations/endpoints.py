"""HTTP face of conversations: parse, call the service, shape the response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response, status
from fastapi.responses import JSONResponse

from app.auth.dependencies import Tenant
from app.conversations import schemas
from app.conversations.service import ConversationService
from app.kit.db import Session
from app.kit.errors import PreconditionFailed, Problem
from app.kit.idempotency import Idempotency, fingerprint
from app.kit.json_body import StrictJSONRoute
from app.models import Conversation
from app.models.message import SEQ_MAX

ConversationId = Annotated[str, Path(max_length=64, description="A conversation id (`conv_…`).")]

ERRORS = {
    code: {"model": Problem, "content": {"application/problem+json": {}}}
    for code in (400, 401, 404, 409, 413, 422)
}

TOOL_RESULT_ERRORS = {
    code: {"model": Problem, "content": {"application/problem+json": {}}} for code in (410, 412)
}
router = APIRouter(
    prefix="/v1/conversations",
    tags=["conversations"],
    responses=ERRORS,  # type: ignore[arg-type]
    route_class=StrictJSONRoute,
)


def get_service(request: Request, session: Session) -> ConversationService:
    """A service bound to this request's session and the app's shared resources."""
    state = request.app.state
    return ConversationService(
        session=session,
        settings=state.settings,
        personas=state.personas,
        loop=state.turn_loop,
        locks=state.locks,
        mcp=state.mcp,
    )


Service = Annotated[ConversationService, Depends(get_service)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        description="Retry-safe writes: the same key and body return the stored response.",
    ),
]
IfMatch = Annotated[
    str | None,
    Header(alias="If-Match", max_length=32, description="Run only if the conversation is at this version."),
]


async def idempotency_for(request: Request, *, tenant: str, key: str | None) -> Idempotency | None:
    """The request's idempotency handle, or None without a key."""
    if key is None:
        return None
    return Idempotency(
        sessionmaker=request.app.state.sessionmaker,
        tenant=tenant,
        key=key,
        request_hash=fingerprint(method=request.method, path=request.url.path, body=await request.body()),
    )


async def run_idempotent(
    idempotency: Idempotency | None,
    work: Callable[[Idempotency | None], Awaitable[schemas.TurnOut]],
    *,
    status_code: int,
) -> Response:
    """Replay a stored response, or do the work with the key claimed (released again on failure)."""
    if idempotency is not None:
        stored = await idempotency.begin()
        if stored is not None:
            return JSONResponse(
                stored.body, status_code=stored.status_code, headers={"Idempotent-Replayed": "true"}
            )
    try:
        turn = await work(idempotency)
    except BaseException:
        if idempotency is not None:
            await idempotency.abandon()
        raise
    return JSONResponse(turn.model_dump(mode="json"), status_code=status_code)


async def continue_conversation(
    request: Request,
    *,
    service: ConversationService,
    tenant: str,
    conversation_id: str,
    idempotency_key: str | None,
    if_match: str | None,
    run: Callable[[Conversation, Idempotency | None], Awaitable[schemas.TurnOut]],
) -> Response:
    """A turn on an existing conversation: idempotent, and conditional on ``If-Match``."""
    idempotency = await idempotency_for(request, tenant=tenant, key=idempotency_key)

    async def work(idem: Idempotency | None) -> schemas.TurnOut:
        conversation = await service.get(tenant=tenant, conversation_id=conversation_id)
        check_version(if_match, conversation.version)
        return await run(conversation, idem)

    return await run_idempotent(idempotency, work, status_code=status.HTTP_200_OK)


def check_version(if_match: str | None, version: int) -> None:
    """412 when the caller's If-Match names another version than the conversation's."""
    if if_match is None:
        return
    wanted = if_match.strip().strip('"').removeprefix("W/").strip('"')
    if wanted != str(version):
        raise PreconditionFailed(
            f"If-Match is {if_match!r} but the conversation is at version {version}.",
            extra={"current": {"version": version}},
        )


@router.post("", status_code=status.HTTP_201_CREATED, response_model=schemas.TurnOut)
async def create_conversation(
    request: Request,
    body: schemas.CreateConversation,
    tenant: Tenant,
    service: Service,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Create a conversation and run its first turn."""
    idempotency = await idempotency_for(request, tenant=tenant, key=idempotency_key)
    return await run_idempotent(
        idempotency,
        lambda idem: service.create(tenant=tenant, body=body, idempotency=idem),
        status_code=status.HTTP_201_CREATED,
    )


@router.post("/{conversation_id}/messages", response_model=schemas.TurnOut, responses=TOOL_RESULT_ERRORS)  # type: ignore[arg-type]
async def post_message(
    request: Request,
    conversation_id: ConversationId,
    body: schemas.PostMessage,
    tenant: Tenant,
    service: Service,
    idempotency_key: IdempotencyKey = None,
    if_match: IfMatch = None,
) -> Response:
    """Send the next user message and run a turn."""
    return await continue_conversation(
        request,
        service=service,
        tenant=tenant,
        conversation_id=conversation_id,
        idempotency_key=idempotency_key,
        if_match=if_match,
        run=lambda conversation, idem: service.post_message(conversation, body=body, idempotency=idem),
    )


@router.post("/{conversation_id}/tool-results", response_model=schemas.TurnOut, responses=TOOL_RESULT_ERRORS)  # type: ignore[arg-type]
async def submit_tool_results(
    request: Request,
    conversation_id: ConversationId,
    body: schemas.ToolResults,
    tenant: Tenant,
    service: Service,
    idempotency_key: IdempotencyKey = None,
    if_match: IfMatch = None,
) -> Response:
    """Answer the pending tool calls; the paused block resumes where it stopped and the turn goes on."""
    return await continue_conversation(
        request,
        service=service,
        tenant=tenant,
        conversation_id=conversation_id,
        idempotency_key=idempotency_key,
        if_match=if_match,
        run=lambda conversation, idem: service.submit_tool_results(conversation, body=body, idempotency=idem),
    )


@router.get("/{conversation_id}", response_model=schemas.ConversationOut)
async def get_conversation(
    conversation_id: ConversationId, tenant: Tenant, service: Service
) -> schemas.ConversationOut:
    """The conversation's status, version, pending tool calls and usage."""
    conversation = await service.get(tenant=tenant, conversation_id=conversation_id)
    return await service.view(conversation)


@router.get("/{conversation_id}/messages", response_model=schemas.MessageList)
async def list_messages(
    conversation_id: ConversationId,
    tenant: Tenant,
    service: Service,
    after: Annotated[
        int, Query(ge=-1, le=SEQ_MAX, description="Return messages with seq greater than this.")
    ] = -1,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> schemas.MessageList:
    """The transcript, oldest first, paginated by `seq`."""
    conversation = await service.get(tenant=tenant, conversation_id=conversation_id)
    return await service.messages(conversation, after=after, limit=limit)


@router.delete("/{conversation_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_conversation(conversation_id: ConversationId, tenant: Tenant, service: Service) -> Response:
    """Delete the conversation and everything it owns."""
    await service.delete(tenant=tenant, conversation_id=conversation_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
