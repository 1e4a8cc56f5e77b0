"""HTTP face of conversations: parse, call the service, shape the response."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Header, Path, Query, Request, Response, status
from fastapi.responses import JSONResponse

from app.auth.dependencies import Tenant
from app.conversations import schemas
from app.conversations.background import service_for
from app.conversations.repository import ConversationRepository
from app.conversations.service import ConversationService
from app.events.repository import EventRepository
from app.events.schemas import END_TYPES, EventList, EventOut
from app.events.sse import event_stream
from app.events.stream import CutOff, Heartbeat, follow, stored_page
from app.kit.clock import utcnow
from app.kit.db import Session, autocommit_unit
from app.kit.errors import BadRequest, NotFound, PreconditionFailed, Unprocessable
from app.kit.idempotency import Idempotency, fingerprint
from app.kit.openapi import header, problem_responses
from app.kit.routing import api_router
from app.models import Conversation, Turn
from app.models.message import SEQ_MAX

ConversationId = Annotated[str, Path(max_length=64, description="A conversation id (`conv_…`).")]

# Each route names its domain errors; 400/401/413/422/503 follow from its dependencies (app.kit.openapi).
NOT_FOUND = problem_responses(404)
router = api_router(prefix="/v1/conversations", tags=["conversations"])


async def get_service(request: Request, session: Session) -> ConversationService:
    """A service bound to this request's session and the app's shared resources."""
    return service_for(request.app.state.resources, session)


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
    Header(
        alias="If-Match",
        max_length=32,
        description='Run only if the conversation is at this version (its `ETag`, `"3"`); 412 otherwise.',
        pattern=r'^(W/)?"?[0-9]{1,18}"?$',  # an ETag this API gave; anything else is a 422, not a 412
    ),
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
        # As short-lived as the turn lock: a dead replica's claim blocks a retry no longer than its lock.
        lease_seconds=request.app.state.settings.lock_lease_seconds,
    )


async def run_idempotent(
    request: Request,
    idempotency: Idempotency | None,
    work: Callable[[Idempotency | None], Awaitable[schemas.TurnOut]],
    *,
    status_code: int,
    body: schemas.TurnRequest,
    tenant: str,
) -> Response:
    """Replay a stored response, or do the work with the key claimed (released again on failure).

    The claim is renewed for as long as the work runs, so it never expires under a live request.
    A streamed request answers with the turn's events (a replayed one, with the stored events),
    and takes one of its tenant's event streams first (``TenantLimiter.open_stream``: a refused
    request has done nothing), given back when its stream ends.
    """
    release = request.app.state.limiter.open_stream(tenant) if body.stream else None
    try:
        return await _run_idempotent(
            request, idempotency, work, status_code=status_code, body=body, release=release
        )
    except BaseException:
        if release is not None:
            release()
        raise


async def _run_idempotent(
    request: Request,
    idempotency: Idempotency | None,
    work: Callable[[Idempotency | None], Awaitable[schemas.TurnOut]],
    *,
    status_code: int,
    body: schemas.TurnRequest,
    release: Callable[[], None] | None,
) -> Response:
    """``run_idempotent`` once its stream (if any) is counted; ``release`` ends that stream's count,
    called by the streamed response when it is over, or here when the answer is no stream."""
    if idempotency is not None:
        stored = await idempotency.begin()
        if stored is not None:
            if body.stream and "turn_id" in stored.body:
                return await turn_events(
                    request,
                    conversation_id=stored.body["conversation_id"],
                    turn_id=stored.body["turn_id"],
                    # What the first answer said: the endpoint's status (201 for a create), not
                    # the stored 202 of a background turn, which a stream never answers.
                    status_code=status_code,
                    headers={"Idempotent-Replayed": "true"},
                    on_close=release,
                )
            if release is not None:
                release()
            replayed = {"Idempotent-Replayed": "true"} | _turn_headers(
                stored.body, status_code=stored.status_code
            )
            return JSONResponse(stored.body, status_code=stored.status_code, headers=replayed)
    try:
        async with idempotency.kept_alive() if idempotency is not None else contextlib.nullcontext():
            turn = await work(idempotency)
    except BaseException:
        if idempotency is not None:
            await idempotency.abandon()
        raise
    location = _location(turn.conversation_id, turn.turn_id)
    if body.stream:
        return await turn_events(
            request,
            conversation_id=turn.conversation_id,
            turn_id=turn.turn_id,
            status_code=status_code,
            headers=location,
            on_close=release,
        )
    if body.background:
        return JSONResponse(
            turn.model_dump(mode="json"), status_code=status.HTTP_202_ACCEPTED, headers=location
        )
    headers = etag(turn.version)
    if status_code == status.HTTP_201_CREATED:
        headers |= location
    return JSONResponse(turn.model_dump(mode="json"), status_code=status_code, headers=headers)


def _location(conversation_id: str, turn_id: str) -> dict[str, str]:
    return {"Location": f"/v1/conversations/{conversation_id}/turns/{turn_id}"}


def _turn_headers(body: dict[str, Any], *, status_code: int) -> dict[str, str]:
    """What a first answer carried besides its body: ``ETag`` (a waited turn), ``Location`` (201, 202)."""
    headers: dict[str, str] = {}
    if isinstance(body.get("version"), int) and status_code != status.HTTP_202_ACCEPTED:
        headers |= etag(body["version"])
    if status_code in (status.HTTP_201_CREATED, status.HTTP_202_ACCEPTED) and "turn_id" in body:
        headers |= _location(str(body.get("conversation_id")), str(body["turn_id"]))
    return headers


def etag(version: int) -> dict[str, str]:
    """The ``ETag`` of a conversation at ``version``: what ``If-Match`` takes back."""
    return {"ETag": f'"{version}"'}


async def turn_events(
    request: Request,
    *,
    conversation_id: str,
    turn_id: str,
    status_code: int,
    headers: dict[str, str] | None = None,
    on_close: Callable[[], None] | None = None,
) -> Response:
    """The events of one turn as SSE, from its ``turn.started`` to its end event, live while it runs."""
    return event_stream(
        turn_event_items(request, conversation_id=conversation_id, turn_id=turn_id),
        status_code=status_code,
        headers=headers,
        on_close=on_close,
    )


async def turn_event_items(
    request: Request, *, conversation_id: str, turn_id: str
) -> AsyncIterator[EventOut | Heartbeat | CutOff]:
    """The events of one turn, stored then live, ending with its end event (heartbeats between)."""
    sessionmaker = request.app.state.sessionmaker
    async with sessionmaker() as session:
        first = await EventRepository(session).first_seq_of_turn(
            conversation_id=conversation_id, turn_id=turn_id
        )

    async def running() -> bool:
        async with sessionmaker() as session:
            turn = await session.get(Turn, turn_id)
            return turn is not None and turn.status in ("queued", "running")

    async def events() -> AsyncIterator[EventOut | Heartbeat | CutOff]:
        async for item in follow(
            sessionmaker=sessionmaker,
            bus=request.app.state.bus,
            conversation_id=conversation_id,
            after=(first or 1) - 1,
            mode="turn",
            running=running,
        ):
            if isinstance(item, EventOut) and item.turn_id != turn_id:
                continue
            yield item
            if isinstance(item, EventOut) and item.type in END_TYPES:
                return

    async for item in events():
        yield item


async def continue_conversation(
    request: Request,
    *,
    service: ConversationService,
    tenant: str,
    conversation_id: str,
    idempotency_key: str | None,
    if_match: str | None,
    body: schemas.TurnRequest,
    run: Callable[[Conversation, Idempotency | None], Awaitable[schemas.TurnOut]],
    reads_then_starts: bool = False,
) -> Response:
    """A turn on an existing conversation: idempotent, and conditional on ``If-Match``.

    ``reads_then_starts``: ``run`` changes nothing of the conversation it is given (or calls
    ``leave_autocommit`` first), so a turn waited for reads it and stores itself as running in
    one statement, and nothing more until it commits (``autocommit_unit``: two round trips fewer)."""
    idempotency = await idempotency_for(request, tenant=tenant, key=idempotency_key)

    async def work(idem: Idempotency | None) -> schemas.TurnOut:
        if reads_then_starts and not body.stream and not body.background:
            await autocommit_unit(service.session)
        conversation = await service.get(tenant=tenant, conversation_id=conversation_id)
        check_version(if_match, conversation.version)
        return await run(conversation, idem)

    return await run_idempotent(
        request, idempotency, work, status_code=status.HTTP_200_OK, body=body, tenant=tenant
    )


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


# The three turn-starting POSTs: JSON by default, SSE with `stream`, 202 with `background`.
SSE: dict[str, Any] = {
    "text/event-stream": {
        "schema": {
            "description": "One server-sent event (comments such as heartbeats carry none).",
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "The event's `seq`: resume with `Last-Event-ID`."},
                "event": {"type": "string", "description": "The event's `type`."},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"$ref": "#/components/schemas/EventOut"},
                },
            },
            "required": ["id", "event", "data"],
        }
    }
}
# Where the ids a turn's answer carries are used next (generators and schemathesis follow them).
TURN_LINKS: dict[str, Any] = {
    name: {"operationId": operation, "parameters": parameters}
    for name, operation, parameters in (
        ("GetConversation", "conversations.get", {"conversation_id": "$response.body#/conversation_id"}),
        (
            "PostMessage",
            "conversations.messages.create",
            {"conversation_id": "$response.body#/conversation_id"},
        ),
        (
            "SubmitToolResults",
            "conversations.tool_results.create",
            {"conversation_id": "$response.body#/conversation_id"},
        ),
        (
            "GetTurn",
            "conversations.turns.get",
            {"conversation_id": "$response.body#/conversation_id", "turn_id": "$response.body#/turn_id"},
        ),
        (
            "CancelTurn",
            "conversations.turns.cancel",
            {"conversation_id": "$response.body#/conversation_id", "turn_id": "$response.body#/turn_id"},
        ),
        ("ListEvents", "conversations.events.list", {"conversation_id": "$response.body#/conversation_id"}),
    )
}
STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The turn, or with `stream: true` its events as `text/event-stream`.",
        "content": SSE,
        "links": TURN_LINKS,
    },
    202: {
        "model": schemas.TurnOut,
        "description": "`background: true`: the turn, queued.",
        "headers": header("Location", required=True),
    },
    **problem_responses(404, 409, 412),
}
CREATE_DOC: dict[int | str, dict[str, Any]] = {
    201: {
        "description": "The first turn, or with `stream: true` its events as `text/event-stream`.",
        "content": SSE,
        "headers": header("Location", required=True) | header("ETag"),
        "links": TURN_LINKS,
    },
    202: STREAM_DOC[202],
    **problem_responses(409),
}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=schemas.TurnOut, responses=CREATE_DOC)
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
        request,
        idempotency,
        lambda idem: service.create(tenant=tenant, body=body, idempotency=idem),
        status_code=status.HTTP_201_CREATED,
        body=body,
        tenant=tenant,
    )


@router.post("/{conversation_id}/messages", response_model=schemas.TurnOut, responses=STREAM_DOC)
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
        body=body,
        run=lambda conversation, idem: service.post_message(conversation, body=body, idempotency=idem),
        reads_then_starts=True,
    )


@router.post(
    "/{conversation_id}/tool-results",
    response_model=schemas.TurnOut,
    responses={**STREAM_DOC, **problem_responses(410)},
)
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
        body=body,
        run=lambda conversation, idem: service.submit_tool_results(conversation, body=body, idempotency=idem),
        reads_then_starts=True,
    )


@router.get(
    "/{conversation_id}",
    response_model=schemas.ConversationOut,
    responses={200: {"headers": header("ETag", required=True)}, **NOT_FOUND},
)
async def get_conversation(
    conversation_id: ConversationId, tenant: Tenant, service: Service, response: Response
) -> schemas.ConversationOut:
    """The conversation's status, version, pending tool calls and usage."""
    conversation = await service.get(tenant=tenant, conversation_id=conversation_id)
    response.headers.update(etag(conversation.version))
    return await service.view(conversation)


@router.get("/{conversation_id}/messages", response_model=schemas.MessageList, responses=NOT_FOUND)
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


@router.delete(
    "/{conversation_id}", status_code=status.HTTP_204_NO_CONTENT, responses=problem_responses(404, 409)
)
async def delete_conversation(conversation_id: ConversationId, tenant: Tenant, service: Service) -> Response:
    """Delete the conversation and everything it owns."""
    await service.delete(tenant=tenant, conversation_id=conversation_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# -- finding conversations --------------------------------------------------------------------------

LIST_PARAMETERS = frozenset({"status", "persona", "limit", "after"})
MAX_METADATA_FILTERS = 16


async def metadata_filters(request: Request) -> dict[str, str]:
    """The ``metadata[KEY]=VALUE`` query parameters, ANDed. Any other parameter the listing does not
    know is a 422 too: a misspelt filter must not silently list everything."""
    filters: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name in LIST_PARAMETERS:
            continue
        loc = ["query", name]
        if not (name.startswith("metadata[") and name.endswith("]")):
            raise Unprocessable(
                f"{name}: unknown query parameter; the filters are status, persona and metadata[KEY]=VALUE.",
                extra={"errors": [{"loc": loc, "msg": "unknown query parameter", "type": "extra_forbidden"}]},
            )
        key = name[len("metadata[") : -1]
        problem = None
        if len(key) > schemas.METADATA_KEY_CHARS:
            problem = f"keys are at most {schemas.METADATA_KEY_CHARS} characters"
        elif len(value) > schemas.METADATA_VALUE_CHARS:
            problem = f"values are at most {schemas.METADATA_VALUE_CHARS} characters"
        elif key in filters and filters[key] != value:
            problem = "given twice with different values (filters are ANDed, so nothing would match)"
        if problem is not None:
            raise Unprocessable(
                f"{name}: {problem}.", extra={"errors": [{"loc": loc, "msg": problem, "type": "value_error"}]}
            )
        filters[key] = value
        if len(filters) > MAX_METADATA_FILTERS:
            raise Unprocessable(
                f"metadata: at most {MAX_METADATA_FILTERS} metadata filters.",
                extra={"errors": [{"loc": loc, "msg": "too many metadata filters", "type": "too_long"}]},
            )
    return filters


METADATA_FILTER_DOC = {
    "parameters": [
        {
            "name": "metadata",
            "in": "query",
            "required": False,
            "style": "deepObject",
            "explode": True,
            "schema": {"type": "object", "additionalProperties": {"type": "string"}},
            "description": (
                "`metadata[KEY]=VALUE`, repeatable with different keys (all must match). VALUE is compared "
                "as a string with the stored scalar's JSON text, a string without its quotes: "
                '`metadata[tier]=gold` matches `"gold"`, `metadata[seats]=5` matches `5` and '
                '`"5"`, `metadata[beta]=true` matches `true` and `"true"`, a float matches as '
                "written (`1.5`); null never matches. At most "
                f"{MAX_METADATA_FILTERS} filters; other unknown parameters are a 422."
            ),
        }
    ]
}


@router.get("", response_model=schemas.ConversationList, openapi_extra=METADATA_FILTER_DOC)
async def list_conversations(
    tenant: Tenant,
    service: Service,
    metadata: Annotated[dict[str, str], Depends(metadata_filters)],
    status_filter: Annotated[
        schemas.ConversationStatus | None,
        Query(
            alias="status",
            description="`idle` or `awaiting_tool_results`: the state stored between turns (a "
            "conversation whose turn is running is listed under the state it started from, and "
            "shows `running`). `running` is a 422: it is a lease lock, not a stored state.",
        ),
    ] = None,
    persona: Annotated[str | None, Query(max_length=64, description="Persona name.")] = None,
    after: Annotated[
        str | None,
        Query(max_length=200, description="`next_after` of the previous page (an opaque cursor)."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size.")] = 20,
) -> schemas.ConversationList:
    """The tenant's conversations, newest first, in pages that hold still while conversations are
    created between them (the cursor is a position, not an offset). A malformed cursor is a 422
    `invalid_cursor`."""
    return await service.list_conversations(
        tenant=tenant, status=status_filter, persona=persona, metadata=metadata, after=after, limit=limit
    )


@router.patch(
    "/{conversation_id}", response_model=schemas.ConversationOut, responses=problem_responses(404, 409, 412)
)
async def patch_conversation(
    conversation_id: ConversationId,
    body: schemas.PatchConversation,
    tenant: Tenant,
    service: Service,
    response: Response,
    if_match: IfMatch = None,
) -> schemas.ConversationOut:
    """Update the conversation's metadata as a JSON merge patch (RFC 7396; `application/json` or
    `application/merge-patch+json`): named keys are set, keys set to `null` removed, others kept.
    The version does not change (it counts turns, and a running turn is not disturbed);
    `If-Match: <version>` applies the patch only at that version (412 otherwise)."""
    conversation = await service.get(tenant=tenant, conversation_id=conversation_id)
    check_version(if_match, conversation.version)
    response.headers.update(etag(conversation.version))
    return await service.update_metadata(
        conversation, patch=body.metadata, if_version=conversation.version if if_match is not None else None
    )


# -- turns as resources and their events ----------------------------------------------------------

TurnId = Annotated[str, Path(max_length=64, description="A turn id (`turn_…`).")]


@router.get("/{conversation_id}/turns", response_model=schemas.TurnList, responses=NOT_FOUND)
async def list_turns(
    conversation_id: ConversationId,
    tenant: Tenant,
    service: Service,
    before: Annotated[str | None, Query(max_length=64, description="A turn id: older turns.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> schemas.TurnList:
    """The conversation's turns, newest first."""
    conversation = await service.get(tenant=tenant, conversation_id=conversation_id)
    return await service.list_turns(conversation, before=before, limit=limit)


@router.get("/{conversation_id}/turns/{turn_id}", response_model=schemas.TurnOut, responses=NOT_FOUND)
async def get_turn(
    conversation_id: ConversationId, turn_id: TurnId, tenant: Tenant, service: Service
) -> schemas.TurnOut:
    """One turn: queued, running, or how it ended."""
    conversation = await service.get(tenant=tenant, conversation_id=conversation_id)
    return await service.get_turn(conversation, turn_id=turn_id)


@router.post(
    "/{conversation_id}/turns/{turn_id}/cancel",
    response_model=schemas.TurnOut,
    operation_id="conversations.turns.cancel",
    responses={
        202: {"model": schemas.TurnOut, "description": "Not stopped yet."},
        **problem_responses(404, 409),
    },
)
async def cancel_turn(
    conversation_id: ConversationId,
    turn_id: TurnId,
    tenant: Tenant,
    service: Service,
    wait: Annotated[float, Query(ge=0, le=30, description="Seconds to wait for the turn to stop.")] = 10,
) -> Response:
    """Stop a queued or running turn wherever it runs: the model call is abandoned, the block is
    killed, and the turn ends ``cancelled`` with what it had done so far stored. 200 with the
    cancelled turn (again on a repeated cancel), 202 if it has not stopped within ``wait`` seconds,
    409 if it had already ended otherwise."""
    conversation = await service.get(tenant=tenant, conversation_id=conversation_id)
    turn = await service.cancel_turn(conversation, turn_id=turn_id, wait=wait)
    code = status.HTTP_200_OK if turn.status == "cancelled" else status.HTTP_202_ACCEPTED
    return JSONResponse(turn.model_dump(mode="json"), status_code=code)


@router.get(
    "/{conversation_id}/events",
    response_model=EventList,
    responses={
        200: {
            "description": "A page of events, or with `Accept: text/event-stream` the events as SSE.",
            "content": SSE,
        },
        **problem_responses(400, 404),
    },
)
async def list_events(
    request: Request,
    conversation_id: ConversationId,
    tenant: Tenant,
    service: Service,
    after: Annotated[int, Query(ge=0, le=SEQ_MAX, description="Events with seq greater than this.")] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    follow_mode: Annotated[
        bool,
        Query(alias="follow", description="SSE: stay open across turns (heartbeat every 15 s)."),
    ] = False,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            max_length=20,
            description="SSE: resume after this event (the `id:` of the last one received).",
            json_schema_extra={"pattern": r"^[0-9]{1,9}$"},  # checked below: a 400, as SSE clients expect
        ),
    ] = None,
) -> Response:
    """The conversation's events in order. As JSON, one page after ``after``; as SSE
    (``Accept: text/event-stream``), what is stored after ``Last-Event-ID`` (or ``after``), then the
    running turn live until its end event (``follow=true``: every later turn too)."""
    conversation = await service.get(tenant=tenant, conversation_id=conversation_id)
    # End the request's transaction now: a stream can stay open for hours, and the dependency would
    # otherwise keep its connection (idle in transaction) until then: 30 followers, an empty pool.
    await service.session.commit()
    sessionmaker = request.app.state.sessionmaker
    if last_event_id is not None:
        seq = last_event_id.strip()
        # ASCII digits only: str.isdigit() is also true of superscripts, which int() refuses (a 500).
        if not (seq.isascii() and seq.isdigit()) or int(seq) > SEQ_MAX:
            raise BadRequest(f"Last-Event-ID {last_event_id!r} is not an event seq of this conversation.")
        after = int(seq)
    async with sessionmaker() as session:
        last = await EventRepository(session).last_seq(conversation_id=conversation.id)
    if after > last:
        raise NotFound(f"No event {after} on this conversation yet (its last is {last}).")
    if "text/event-stream" not in request.headers.get("accept", ""):
        page = await stored_page(sessionmaker, conversation_id=conversation.id, after=after, limit=limit + 1)
        return JSONResponse(
            EventList(
                data=page[:limit],
                has_more=len(page) > limit,
                next_after=page[limit - 1].seq if len(page) > limit else None,
            ).model_dump(mode="json")
        )
    locks = request.app.state.locks

    async def running() -> bool:
        if await locks.holder(conversation.id) is not None:
            return True
        async with sessionmaker() as session:
            return await ConversationRepository(session).has_active_turn(
                conversation_id=conversation.id, now=utcnow()
            )

    # Counted last: nothing after this refuses the stream, whose end gives the place back.
    release = request.app.state.limiter.open_stream(tenant)
    return event_stream(
        follow(
            sessionmaker=sessionmaker,
            bus=request.app.state.bus,
            conversation_id=conversation.id,
            after=after,
            mode="forever" if follow_mode else "turn",
            running=running,
        ),
        on_close=release,
    )
