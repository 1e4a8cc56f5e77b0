"""HTTP face of conversations: parse, call the service, shape the response."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status

from app.auth.dependencies import Tenant
from app.conversations import schemas
from app.conversations.service import ConversationService
from app.kit.db import Session
from app.kit.errors import Problem

ConversationId = Annotated[str, Path(max_length=64, description="A conversation id (`conv_…`).")]

ERRORS = {
    code: {"model": Problem, "content": {"application/problem+json": {}}}
    for code in (400, 401, 404, 409, 413, 422)
}

router = APIRouter(prefix="/v1/conversations", tags=["conversations"], responses=ERRORS)  # type: ignore[arg-type]


def get_service(request: Request, session: Session) -> ConversationService:
    """A service bound to this request's session and the app's shared resources."""
    state = request.app.state
    return ConversationService(
        session=session,
        settings=state.settings,
        personas=state.personas,
        loop=state.turn_loop,
        locks=state.locks,
    )


Service = Annotated[ConversationService, Depends(get_service)]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=schemas.TurnOut)
async def create_conversation(
    body: schemas.CreateConversation, tenant: Tenant, service: Service
) -> schemas.TurnOut:
    """Create a conversation and run its first turn."""
    return await service.create(tenant=tenant, body=body)


@router.post("/{conversation_id}/messages", response_model=schemas.TurnOut)
async def post_message(
    conversation_id: ConversationId, body: schemas.PostMessage, tenant: Tenant, service: Service
) -> schemas.TurnOut:
    """Send the next user message and run a turn."""
    return await service.post_message(tenant=tenant, conversation_id=conversation_id, body=body)


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
    after: Annotated[int, Query(ge=-1, description="Return messages with seq greater than this.")] = -1,
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
