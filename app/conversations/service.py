"""The rules of the conversations API: who may do what, in which state, and how a turn is persisted.

A turn spans three phases so that no database connection is held while the model thinks:
load and lock (short transaction), run the loop (no transaction), persist (one transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import keyword
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm.attributes import set_committed_value

from app.config import Settings
from app.conversations import schemas
from app.conversations.control import TurnControl
from app.conversations.locks import ConversationLocks
from app.conversations.repository import ConversationRepository
from app.events.recorder import TurnRecorder
from app.events.repository import EventRepository
from app.events.schemas import EventType
from app.events.webhooks import schedule_turn_webhook, webhook_event
from app.files.repository import FileRepository
from app.helpers import HELPERS, Usage
from app.kit import periodic, tracing
from app.kit.clock import utcnow
from app.kit.db import autocommit_unit, leave_autocommit
from app.kit.errors import Conflict, Gone, NotFound, PayloadTooLarge, PreconditionFailed, Unprocessable
from app.kit.idempotency import Idempotency
from app.kit.ids import new_id
from app.kit.metrics import LLM_TOKENS, OTHER_LABEL, TURN_SECONDS, TURNS
from app.models import Conversation, StoredFile, Turn
from app.orchestrator.loop import TurnError, TurnInput, TurnLoop, TurnOutcome
from app.orchestrator.messages import (
    HelpersResultPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    TranscriptMessage,
    load_parts,
)
from app.orchestrator.paused import PausedBlock, ResumeBlock
from app.orchestrator.render import StoredMessage
from app.personas.models import McpRef, Persona, PythonRef
from app.personas.prompt import build_prompt
from app.personas.service import sandbox_tool
from app.personas.tooldoc import FunctionToolDoc
from app.runtime import CallReply, Limits
from app.runtime.protocol import RESERVED_NAMES as RUNTIME_NAMES
from app.tools.mcp import McpManager
from app.tools.registry import ToolDefinitionError, ToolRegistry, make_tool
from app.tools.schema import INLINE_SCHEMA_NODES, SchemaProblem, check_request_size, off_loop

if TYPE_CHECKING:
    from app.auth.limits import TenantLimiter
    from app.wiring import Resources

log = structlog.get_logger(__name__)


class TurnRunning(Conflict):
    code = "turn_in_progress"
    title = "A turn is already running on this conversation"


class AwaitingToolResults(Conflict):
    code = "awaiting_tool_results"
    title = "The conversation is waiting for tool results"


class NothingPending(Conflict):
    code = "no_pending_tool_calls"
    title = "No tool calls are pending"


class ToolCallsExpired(Gone):
    code = "tool_calls_expired"
    title = "The pending tool calls expired"


class WrongToolCallIds(Unprocessable):
    code = "tool_call_ids_mismatch"
    title = "Results do not match the pending tool calls"


class InvalidTool(Unprocessable):
    code = "invalid_tool"
    title = "Invalid tool definition"


class TurnFinished(Conflict):
    code = "turn_finished"
    title = "The turn already ended"


class UnknownPersona(Unprocessable):
    code = "unknown_persona"
    title = "Unknown persona"


class InvalidHistory(Unprocessable):
    code = "invalid_history"
    title = "Invalid conversation history"


class InvalidCursor(Unprocessable):
    code = "invalid_cursor"
    title = "Invalid pagination cursor"


# A metadata PATCH that keeps losing its compare-and-set this many times in a row gives up (409).
METADATA_PATCH_ATTEMPTS = 5
# How long a stored turn's runner that stops before the turn's end tries to give its claim back.
GIVE_UP_SECONDS = 5.0


@dataclass(slots=True)
class ConversationService:
    """One request's view of the conversations domain (built per request by the dependency)."""

    session: AsyncSession
    settings: Settings
    personas: dict[str, Persona]
    loop: TurnLoop
    locks: ConversationLocks
    mcp: McpManager | None = None
    control: TurnControl | None = None  # detached turns and cancels (None: only waited-for turns)
    sessionmaker: async_sessionmaker[AsyncSession] | None = None  # events written while a turn runs
    resources: Resources | None = None  # the process's shared resources (webhooks are queued on its jobs)
    # Called with a waited-for turn's result in the transaction that stores it (the Chat Completions
    # face links the dialogue to the conversation there, so the two are committed together).
    on_stored: Callable[[schemas.TurnOut], Awaitable[None]] | None = None

    @property
    def repo(self) -> ConversationRepository:
        return ConversationRepository(self.session)

    @property
    def limiter(self) -> TenantLimiter | None:
        """The process's per-tenant limits (None without the shared resources, as in unit use)."""
        return self.resources.limiter if self.resources is not None else None

    # -- reads ---------------------------------------------------------------------------------

    async def get(self, *, tenant: str, conversation_id: str) -> Conversation:
        """The tenant's conversation or 404 (another tenant's id looks the same as a missing one)."""
        conversation = await self.repo.get(tenant=tenant, conversation_id=conversation_id)
        if conversation is None:
            raise NotFound(f"No conversation {conversation_id!r}.")
        return conversation

    async def view(self, conversation: Conversation) -> schemas.ConversationOut:
        """The conversation as the API shows it, including whether a turn is running now."""
        running = await self.locks.holder(conversation.id)
        status: schemas.ConversationStatus = "running" if running else conversation.status  # type: ignore[assignment]
        return schemas.ConversationOut(
            id=conversation.id,
            persona=conversation.persona,
            model=conversation.model or self.settings.model,
            status=status,
            version=conversation.version,
            metadata=conversation.metadata_,
            max_iterations=conversation.max_iterations,
            pending_tool_calls=_pending_out(self._paused(conversation)) if conversation.paused else [],
            usage=Usage(
                input_tokens=conversation.input_tokens,
                output_tokens=conversation.output_tokens,
                llm_calls=conversation.llm_calls,
                iterations=conversation.iterations,
            ),
            created_at=conversation.created_at,
            updated_at=conversation.updated_at,
        )

    async def messages(self, conversation: Conversation, *, after: int, limit: int) -> schemas.MessageList:
        """One page of the transcript."""
        rows = await self.repo.messages(conversation_id=conversation.id, after=after, limit=limit + 1)
        page = rows[:limit]
        return schemas.MessageList(
            data=[
                schemas.MessageOut(
                    id=m.id,
                    seq=m.seq,
                    turn_id=m.turn_id,
                    role=m.role,
                    parts=load_parts(m.parts),
                    created_at=m.created_at,
                )
                for m in page
            ],
            has_more=len(rows) > limit,
            next_after=page[-1].seq if len(rows) > limit else None,
        )

    # -- writes --------------------------------------------------------------------------------

    async def create(
        self, *, tenant: str, body: schemas.CreateConversation, idempotency: Idempotency | None = None
    ) -> schemas.TurnOut:
        """Create a conversation and run its first turn."""
        persona = self.personas.get(body.persona)
        if persona is None:
            names = ", ".join(sorted(self.personas))
            raise UnknownPersona(f"persona: no persona {body.persona!r}; available: {names}.")
        if body.input is not None:
            self._check_input(body.input)
        tools = await _checked_tools(body.tools, field="tools")
        history = seeded_transcript(
            body.messages,
            max_chars=self.settings.max_input_chars,
            max_output_bytes=self.settings.max_tool_output_bytes,
        )
        turn_id = new_id("turn")
        now = utcnow()
        conversation = Conversation(
            id=new_id("conv"),
            tenant=tenant,
            persona=persona.name,
            model=body.model or persona.model or self.settings.model,
            instructions=body.instructions,
            metadata_=dict(body.metadata),
            max_iterations=body.max_iterations or self.settings.max_iterations,
            tools=tools,
            webhook_url=body.webhook_url,
            status="idle",
            version=0,
            next_seq=0,
            input_tokens=0,
            output_tokens=0,
            llm_calls=0,
            iterations=0,
            lock_turn_id=None,
            created_at=now,
            updated_at=now,
        )
        return await self._run_turn(
            conversation,
            turn_id=turn_id,
            new_messages=[*history, *([_user_text(body.input)] if body.input is not None else [])],
            idempotency=idempotency,
            status_code=201,
            new=True,
            delivery=delivery_of(body),
        )

    async def post_message(
        self,
        conversation: Conversation,
        *,
        body: schemas.PostMessage,
        idempotency: Idempotency | None = None,
    ) -> schemas.TurnOut:
        """Run a turn for the next user message (after expired tool calls, the model is told)."""
        self._check_input(body.input)
        new_messages = [_user_text(body.input)]
        if conversation.status == "awaiting_tool_results":
            paused = self._paused(conversation)
            if not _expired(paused):
                raise AwaitingToolResults(
                    "This conversation is waiting for tool results: POST them to "
                    f"/v1/conversations/{conversation.id}/tool-results first.",
                    extra={"current": {"status": conversation.status, "version": conversation.version}},
                )
            names = ", ".join(f"{p.id} ({p.call.name})" for p in paused.pending)
            expired = HelpersResultPart(
                status="error",
                text=f"The block was abandoned: the tool calls {names} expired without results "
                "and were not run.",
            )
            new_messages.insert(0, TranscriptMessage(role="user", parts=[expired]))
            await leave_autocommit(self.session)  # a write of its own, with the turn's start
            conversation.paused = None
        if body.tools is not None:
            await leave_autocommit(self.session)
            merged = {t["name"]: t for t in conversation.tools}
            merged.update({t["name"]: t for t in await _checked_tools(body.tools, field="tools")})
            _check_merged_tools(list(merged.values()))
            conversation.tools = list(merged.values())
        return await self._run_turn(
            conversation,
            turn_id=new_id("turn"),
            new_messages=new_messages,
            idempotency=idempotency,
            delivery=delivery_of(body),
        )

    async def submit_tool_results(
        self,
        conversation: Conversation,
        *,
        body: schemas.ToolResults,
        idempotency: Idempotency | None = None,
    ) -> schemas.TurnOut:
        """Resume the paused block with the caller's results; it runs again from its snapshot."""
        if conversation.status != "awaiting_tool_results" or conversation.paused is None:
            raise NothingPending(
                f"No tool calls are pending on this conversation (status {conversation.status!r}); "
                "the results may already have been consumed.",
                extra={"current": {"status": conversation.status, "version": conversation.version}},
            )
        paused = self._paused(conversation)
        expected = [p.id for p in paused.pending]
        if _expired(paused):
            raise ToolCallsExpired(
                "The pending tool calls expired; send a new message to continue the conversation.",
                extra={"expected_tool_call_ids": expected},
            )
        given = [r.tool_call_id for r in body.results]
        if sorted(given) != sorted(expected) or len(set(given)) != len(given):
            unknown = sorted(set(given) - set(expected))
            missing = sorted(set(expected) - set(given))
            duplicated = sorted({g for g in given if given.count(g) > 1})
            problems = [
                f"{label}: {', '.join(ids)}"
                for label, ids in (("unknown", unknown), ("missing", missing), ("duplicated", duplicated))
                if ids
            ]
            raise WrongToolCallIds(
                "results must answer exactly the pending calls (" + "; ".join(problems) + ").",
                extra={"expected_tool_call_ids": expected},
            )
        limit = self.settings.max_tool_output_bytes
        for result in body.results:
            size = len(json.dumps(result.output, ensure_ascii=False).encode()) if result.error is None else 0
            if size > limit:
                raise PayloadTooLarge(
                    f"results: the output for {result.tool_call_id} is {size} bytes; the limit is {limit} "
                    "(SABRE_MAX_TOOL_OUTPUT_BYTES)."
                )
        by_id = {r.tool_call_id: r for r in body.results}
        replies = {
            call_id: CallReply(kind="error", error_type="ToolError", error_message=result.error)
            if result.error is not None
            else CallReply(kind="value", value=result.output)
            for call_id, result in by_id.items()
        }
        journal, journaled = paused.answered(replies)
        parts: list[ToolResultPart] = []
        for pending in paused.pending:
            result, reply = by_id[pending.id], journaled[pending.id]
            if reply is replies[pending.id]:
                part = ToolResultPart(tool_call_id=pending.id, output=result.output, error=result.error)
            else:  # refused for the journal's size: the transcript says what the block got
                part = ToolResultPart(tool_call_id=pending.id, error=reply.error_message)
            parts.append(part)
        # The paused record stays stored until the turn's outcome replaces it (in _persist): a
        # server that dies during the resume leaves the conversation resumable, not wedged.
        return await self._run_turn(
            conversation,
            turn_id=new_id("turn"),
            new_messages=[TranscriptMessage(role="user", parts=list(parts))],
            resume=ResumeBlock(code=paused.code, journal=journal, note=paused.note),
            idempotency=idempotency,
            delivery=delivery_of(body),
        )

    async def list_conversations(
        self,
        *,
        tenant: str,
        status: schemas.ConversationStatus | None,
        persona: str | None,
        metadata: dict[str, str],
        after: str | None,
        limit: int,
    ) -> schemas.ConversationList:
        """One page of the tenant's conversations, newest first, after the ``after`` cursor.

        ``status`` filters on the state stored between turns (``idle``, ``awaiting_tool_results``):
        a conversation whose turn is running is listed under the state its turn started from, and
        shows ``running`` as GET does. ``running`` itself is not a filter: it is the turn lock's lease
        (a Redis key when Redis is configured), not a column a query can select on.
        """
        if status == "running":
            raise Unprocessable(
                "status: `running` cannot be filtered on (a running turn is a lease lock, not a stored "
                "state); filter on idle or awaiting_tool_results, or read each conversation's status.",
                extra={"errors": [{"loc": ["query", "status"], "msg": "not filterable", "type": "enum"}]},
            )
        before = None
        if after is not None:
            try:
                cursor = schemas.ConversationCursor.decode(after)
            except ValueError:
                raise InvalidCursor(
                    "after: not a cursor this API returned; pass `next_after` from the previous page "
                    "unchanged, or leave it out to start from the newest conversation.",
                    extra={
                        "errors": [{"loc": ["query", "after"], "msg": "invalid cursor", "type": "cursor"}]
                    },
                ) from None
            before = (cursor.created_at, cursor.id)
        rows = await self.repo.search(
            tenant=tenant, status=status, persona=persona, metadata=metadata, before=before, limit=limit + 1
        )
        page = rows[:limit]
        more = len(rows) > limit
        return schemas.ConversationList(
            data=[await self.view(conversation) for conversation in page],
            has_more=more,
            next_after=(
                schemas.ConversationCursor(created_at=page[-1].created_at, id=page[-1].id).encode()
                if more
                else None
            ),
        )

    async def update_metadata(
        self,
        conversation: Conversation,
        *,
        patch: dict[str, schemas.MetadataValue],
        if_version: int | None = None,
    ) -> schemas.ConversationOut:
        """Merge ``patch`` into the conversation's metadata (RFC 7396: ``null`` removes a key).

        The version is left alone on purpose: it is the optimistic lock of turns (a turn checks it
        when it commits), so bumping it here would make a turn running now fail at its end for a
        change of labels it never reads. Instead the read-merge-write is a compare-and-set on
        ``updated_at``, retried a few times, so two PATCHes (or a PATCH and a turn's commit) never
        lose each other's changes. ``if_version`` (from If-Match) is checked at every attempt: a
        turn that ends in between makes the PATCH a 412.
        """
        for _ in range(METADATA_PATCH_ATTEMPTS):
            state = await self.repo.metadata_state(
                tenant=conversation.tenant, conversation_id=conversation.id
            )
            if state is None:
                raise NotFound(f"No conversation {conversation.id!r}.")
            current, seen_updated_at, version = state
            if if_version is not None and version != if_version:
                raise PreconditionFailed(
                    f"If-Match is {if_version} but the conversation is at version {version}.",
                    extra={"current": {"version": version}},
                )
            merged = dict(current)
            for key, value in patch.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            if len(merged) > schemas.METADATA_MAX_KEYS:
                raise Unprocessable(
                    f"metadata: the patch would leave {len(merged)} keys; at most "
                    f"{schemas.METADATA_MAX_KEYS} are allowed (remove some with null).",
                )
            # Strictly later than what we read, so the next compare-and-set sees a change.
            updated_at = max(utcnow(), seen_updated_at + timedelta(microseconds=1))
            if await self.repo.replace_metadata(
                conversation_id=conversation.id,
                metadata=merged,
                seen_updated_at=seen_updated_at,
                version=if_version,
                updated_at=updated_at,
            ):
                await self.session.commit()
                # The loaded object reflects the row without becoming dirty (a flush would check
                # and write the version).
                set_committed_value(conversation, "metadata_", merged)
                set_committed_value(conversation, "updated_at", updated_at)
                set_committed_value(conversation, "version", version)
                return await self.view(conversation)
        raise Conflict("The conversation kept changing while its metadata was updated; retry the PATCH.")

    async def delete(self, *, tenant: str, conversation_id: str) -> None:
        """Delete a conversation, its transcript, turns and working directory, holding its turn
        lock meanwhile: a turn that starts then gets 409, instead of storing itself against rows
        being deleted (a foreign-key failure, a 500, once the deletion committed)."""
        conversation = await self.get(tenant=tenant, conversation_id=conversation_id)
        token = new_id("delete")
        holder = await self.locks.acquire(conversation.id, turn_id=token)
        if holder is not None:
            raise TurnRunning(
                f"Turn {holder} is running on this conversation; delete it when it ends.",
                extra={"current": {"turn_id": holder}},
            )
        try:
            await self.repo.delete(conversation)
            await self.session.commit()  # before the lock goes: a turn that takes it then finds nothing
        finally:
            await self.locks.release(conversation.id, turn_id=token)
        shutil.rmtree(self._workdir(conversation.id), ignore_errors=True)

    # -- the turn ------------------------------------------------------------------------------

    async def _run_turn(
        self,
        conversation: Conversation,
        *,
        turn_id: str,
        new_messages: list[TranscriptMessage],
        idempotency: Idempotency | None,
        resume: ResumeBlock | None = None,
        status_code: int = 200,
        new: bool = False,
        delivery: Delivery = "wait",
    ) -> schemas.TurnOut:
        """Lock, run the loop, persist (``delivery="wait"``), or store the turn and run it detached
        (``"stream"``: in this process now; ``"background"``: on a job worker).

        A ``new`` conversation waited for is stored with its first turn, in one transaction: nobody
        knows its id before the response, so it needs no lock and has no history."""
        started = time.perf_counter()
        structlog.contextvars.bind_contextvars(conversation_id=conversation.id, turn_id=turn_id)
        # The tenant's limits first: a refused turn has written and locked nothing.
        limited = self.limiter is not None and await self.limiter.acquire_turn(conversation.tenant, turn_id)
        if not new:
            seen_version = conversation.version
            try:
                with tracing.span("lock.acquire"):
                    holder = await self.locks.acquire(conversation.id, turn_id=turn_id)
            except BaseException:
                await self._release_place(conversation.tenant, turn_id, held=limited)
                raise
            if holder is not None:
                await self._release_place(conversation.tenant, turn_id, held=limited)
                if holder.startswith("delete_"):
                    raise TurnRunning("This conversation is being deleted.")
                raise TurnRunning(
                    f"Turn {holder} is running on this conversation; retry when it has finished.",
                    extra={"current": {"turn_id": holder}},
                )
        detached = False
        recorder: TurnRecorder | None = None
        started_row: Turn | None = None  # the turn's row as it was stored when it started
        try:
            history: list[StoredMessage] = []
            next_seq = 1
            # Phase 1: check the state under the lock, read the history, store the turn as running.
            with tracing.span("turn.prepare"):
                if not new and delivery != "wait":
                    next_seq = await self._check_state(conversation, seen_version=seen_version) + 1
                elif not new:
                    # Stored as running in the statement that checks the conversation's state, and
                    # (PostgreSQL) reads its history.
                    values = self._turn_values(conversation, turn_id=turn_id, status="running")
                    stored = await self.repo.start_turn_reading_history(
                        values, seen_version=seen_version, now=utcnow()
                    )
                    if stored is None:  # which check failed, and how to say it
                        await self._check_state(conversation, seen_version=seen_version)
                        raise TurnRunning("Another turn took this conversation first; retry when it ended.")
                    last_seq, history = stored
                    next_seq = last_seq + 1
                    started_row = Turn(**values)
                if delivery != "wait":
                    turn = await self._start_detached(
                        conversation,
                        turn_id=turn_id,
                        new_messages=new_messages,
                        resume=resume,
                        idempotency=idempotency,
                        next_seq=next_seq,
                        new=new,
                        background=delivery == "background",
                        status_code=status_code,
                    )
                    detached = True  # the lock now belongs to the detached turn
                    return turn
                recorder = TurnRecorder(
                    conversation_id=conversation.id,
                    turn_id=turn_id,
                    next_seq=next_seq,
                    # Nobody can watch a conversation whose id only this response will tell: its
                    # events go to the store alone (a Redis round trip and their JSON saved).
                    bus=self.control.bus if self.control is not None and not new else None,
                    sessionmaker=None if new else self.sessionmaker,
                    flush_interval=self.settings.events_flush_seconds,
                )
                _record_start(recorder, turn_id=turn_id, new_messages=new_messages, resume=resume)
                # Phase 1 ends: release the connection while the model and the sandbox work (a new
                # conversation wrote nothing yet, but the request may have read, e.g. its API key).
                await self.session.commit()
            outcome = await self._watched_loop(
                conversation,
                turn_id=turn_id,
                history=history,
                new_messages=new_messages,
                resume=resume,
                recorder=recorder,
                watch=not new,
            )
            with tracing.span("turn.persist"):
                turn, rows = await self._persist(
                    conversation,
                    turn_id=turn_id,
                    outcome=outcome,
                    recorder=recorder,
                    new=new,
                    started=started_row,
                    alone=idempotency is None and self.on_stored is None,
                )
                if idempotency is not None:
                    await idempotency.complete(
                        self.session, status_code=status_code, body=turn.model_dump(mode="json")
                    )
                if self.on_stored is not None:
                    await self.on_stored(turn)
                # Commit before the lock is released: the next turn must see this one's state.
                await self.session.commit()
        except BaseException:
            if not detached and recorder is not None:
                await recorder.close()
                if not new:
                    # Our own transaction may hold the turn's row: end it first, or the update waits on us.
                    with contextlib.suppress(Exception):
                        await self.session.rollback()
                    await self._abandon(turn_id)
            raise
        finally:
            if not detached:
                await self._release_place(conversation.tenant, turn_id, held=limited)
                if not new:
                    with tracing.span("lock.release"):
                        await self.locks.release(conversation.id, turn_id=turn_id)
        with tracing.span("turn.publish"):
            await self._ended(conversation, turn, rows=rows, recorder=recorder)
        self._count(conversation, turn, started=started)
        return turn

    async def _check_state(self, conversation: Conversation, *, seen_version: int) -> int:
        """Under the lock: the conversation is still as read before it (another turn may have
        finished meanwhile) and no detached turn holds it. Its last event seq, else Conflict or
        TurnRunning."""
        state = await self.repo.turn_state(conversation_id=conversation.id, now=utcnow())
        if state is None or state.version != seen_version:
            raise Conflict(
                "The conversation changed while this request waited; read it again and retry.",
                extra={"current": {"version": seen_version + 1}},
            )
        if state.active_turn:
            # A detached turn whose lock lapsed while it waited in the queue still counts.
            raise TurnRunning("A turn is queued or running on this conversation; retry when it has finished.")
        return state.last_event_seq

    async def _release_place(self, tenant: str, turn_id: str, *, held: bool = True) -> None:
        """Give the turn's place among its tenant's concurrent turns back (best effort: a place
        that cannot be given back lapses with its lease)."""
        if held and self.limiter is not None:
            try:
                await self.limiter.release_turn(tenant, turn_id)
            except Exception:
                log.warning("turn_place_not_released", tenant=tenant, turn_id=turn_id, exc_info=True)

    def _count(self, conversation: Conversation, turn: schemas.TurnOut, *, started: float) -> None:
        """Metrics (labelled by persona, model and outcome, bounded values) and the log line of a
        turn that ended."""
        model = conversation.model or self.settings.model
        known = {self.settings.model} | {p.model for p in self.personas.values() if p.model}
        labels = {
            "persona": conversation.persona if conversation.persona in self.personas else OTHER_LABEL,
            "model": model if model in known else OTHER_LABEL,
        }
        seconds = time.perf_counter() - started
        TURNS.labels(outcome=turn.status, **labels).inc()
        TURN_SECONDS.labels(outcome=turn.status, **labels).observe(seconds)
        LLM_TOKENS.labels(direction="input", **labels).inc(turn.usage.input_tokens)
        LLM_TOKENS.labels(direction="output", **labels).inc(turn.usage.output_tokens)
        # One line per turn, wherever it ran, under the request id of the request that started it.
        log.info(
            "turn_finished",
            outcome=turn.status,
            persona=conversation.persona,
            model=model,
            iterations=turn.usage.iterations,
            input_tokens=turn.usage.input_tokens,
            output_tokens=turn.usage.output_tokens,
            duration_ms=round(seconds * 1000, 1),
        )

    async def _ended(
        self,
        conversation: Conversation,
        turn: schemas.TurnOut,
        *,
        rows: list[dict[str, Any]],
        recorder: TurnRecorder,
    ) -> None:
        """After a turn's end is committed: its last events to live watchers, its webhook queued,
        its tokens counted against the tenant's quota."""
        await recorder.publish(rows)
        tokens = turn.usage.input_tokens + turn.usage.output_tokens
        if self.limiter is not None and tokens:
            try:
                await self.limiter.add_tokens(conversation.tenant, tokens)
            except Exception:
                log.warning("token_quota_not_counted", tenant=conversation.tenant, exc_info=True)
        if self.resources is not None:
            await schedule_turn_webhook(
                self.resources,
                tenant=conversation.tenant,
                conversation_webhook_url=conversation.webhook_url,
                event_type=webhook_event(turn.status),
                turn=turn.model_dump(mode="json"),
            )

    async def _abandon(self, turn_id: str) -> None:
        """A waited-for turn failed before its outcome was stored (the store failed under it): its
        row ends ``failed`` at once, best effort, so a retry need not wait for its lease to lapse."""
        if self.sessionmaker is None:
            return
        error = TurnError(
            code="turn_not_stored",
            message="The turn's outcome could not be stored; send the request again.",
            retryable=True,
        )
        try:
            async with self.sessionmaker() as session, session.begin():
                await ConversationRepository(session).finish_running(
                    turn_id=turn_id, status="failed", error=_error_json(error), now=utcnow()
                )
        except Exception:
            log.warning("turn_abandon_failed", turn_id=turn_id, exc_info=True)

    async def _start_detached(
        self,
        conversation: Conversation,
        *,
        turn_id: str,
        new_messages: list[TranscriptMessage],
        resume: ResumeBlock | None,
        idempotency: Idempotency | None,
        next_seq: int,
        new: bool,
        background: bool,
        status_code: int,
    ) -> schemas.TurnOut:
        """Store the turn with what it runs (its request) and ``turn.started``, commit, then hand it
        to a job worker (background) or to a task of this process (stream). Either way it survives
        the client going away, and a runner that dies is replaced once its lease expires."""
        if self.control is None:
            raise RuntimeError("detached turns need the process's TurnControl")
        if new:
            self.repo.add(conversation)
        # Queued either way: its runner (a job, or a task of this process) claims it from the store.
        row = Turn(
            **self._turn_values(
                conversation, turn_id=turn_id, status="queued", request=_stored_request(new_messages, resume)
            )
        )
        row.background = background
        self.session.add(row)
        await self.session.flush()  # the conversation and turn rows before their events
        recorder = TurnRecorder(
            conversation_id=conversation.id,
            turn_id=turn_id,
            next_seq=next_seq,
            bus=self.control.bus,
            sessionmaker=None,
        )
        _record_start(recorder, turn_id=turn_id, new_messages=new_messages, resume=resume)
        rows = await recorder.drain(self.session)
        turn = self.turn_out(row, conversation)
        if idempotency is not None:
            await idempotency.complete(
                self.session,
                status_code=202 if background else status_code,
                body=turn.model_dump(mode="json"),
            )
        await self.session.commit()
        if new:
            # Nobody knows the id before the response, so taking the lock only now is safe.
            await self.locks.acquire(conversation.id, turn_id=turn_id)
        await recorder.publish(rows)
        await self.control.dispatch(turn_id, tenant=conversation.tenant, background=background)
        return turn

    async def execute_stored(self, turn_id: str) -> None:
        """Run a stored turn (queued, or left by a runner whose lease expired) to its end.

        At least once is enough: the claim is a compare-and-set on the turn's status and lease, and
        the outcome is written under the conversation's version, so a turn completes exactly once.
        """
        if self.control is None or self.sessionmaker is None:
            raise RuntimeError("stored turns need the process's TurnControl and sessionmaker")
        now = utcnow()
        lease = timedelta(seconds=self.settings.lock_lease_seconds)
        if not await self.repo.claim_turn(
            turn_id=turn_id, owner=self.control.owner, now=now, until=now + lease
        ):
            await self.session.rollback()
            return  # finished, cancelled, or running under a live lease elsewhere
        await self.session.commit()
        try:
            await self._execute_claimed(turn_id)
        except BaseException:
            # Stopped before its end (its worker shutting down, the store failing under it): the
            # turn is given up at once, so that the job put back on the queue, or the next recovery
            # sweep, runs it now rather than once the lease (minutes) has run out.
            await self._give_up(turn_id)
            raise

    async def _give_up(self, turn_id: str) -> None:
        """Lapse the lease of a turn this process claimed (best effort, bounded: a store that does
        not answer leaves the lease to run out)."""
        if self.control is None or self.sessionmaker is None:
            return
        try:
            async with asyncio.timeout(GIVE_UP_SECONDS), self.sessionmaker() as session, session.begin():
                await ConversationRepository(session).renew_turn(
                    turn_id=turn_id, owner=self.control.owner, until=utcnow()
                )
        except Exception:
            log.warning("turn_not_given_up", turn_id=turn_id, exc_info=True)

    async def _execute_claimed(self, turn_id: str) -> None:
        """``execute_stored`` once the turn is claimed by this process."""
        assert self.control is not None
        assert self.sessionmaker is not None
        row = await self.session.get(Turn, turn_id)
        conversation = await self.session.get(Conversation, row.conversation_id) if row is not None else None
        if row is None or conversation is None:
            return  # deleted meanwhile
        started = time.perf_counter()
        # Kept apart: after the rollback of a discarded outcome the loaded objects are expired, and
        # reading an attribute would be a lazy load, which asyncio cannot do (MissingGreenlet).
        conversation_id = conversation.id
        tenant = conversation.tenant
        structlog.contextvars.bind_contextvars(conversation_id=conversation_id, turn_id=turn_id)
        # The request that queued the turn took the lock for it: taken again, with a fresh lease.
        holder = await self.locks.acquire(conversation_id, turn_id=turn_id)
        if holder is not None:
            await self._end_unrun(
                row,
                conversation,
                status="failed",
                error=TurnError(
                    code="turn_superseded",
                    message=f"Turn {holder} took the conversation before this turn could run.",
                ),
            )
            return
        try:
            if conversation.version != row.version:
                await self._end_unrun(
                    row,
                    conversation,
                    status="failed",
                    error=TurnError(
                        code="turn_superseded",
                        message="The conversation changed before this turn could run.",
                    ),
                )
                return
            if row.cancel_requested_at is not None:
                await self._end_unrun(row, conversation, status="cancelled")
                return
            new_messages, resume = _load_request(row.request or {})
            history = await self.repo.history(conversation_id=conversation.id)
            next_seq = await EventRepository(self.session).last_seq(conversation_id=conversation.id) + 1
            await self.session.commit()
            recorder = TurnRecorder(
                conversation_id=conversation.id,
                turn_id=turn_id,
                next_seq=next_seq,
                bus=self.control.bus,
                sessionmaker=self.sessionmaker,
                flush_interval=self.settings.events_flush_seconds,
            )
            outcome = await self._watched_loop(
                conversation,
                turn_id=turn_id,
                history=history,
                new_messages=new_messages,
                resume=resume,
                recorder=recorder,
                watch=True,
            )
            try:
                turn, rows = await self._persist(
                    conversation, turn_id=turn_id, outcome=outcome, recorder=recorder, started=row, alone=True
                )
                await self.session.commit()
            except TurnRunning:
                await self.session.rollback()
                log.warning("stored_turn_discarded", turn_id=turn_id, reason="the conversation moved on")
                return
        finally:
            # The place its request took among the tenant's turns ends with the turn, however it ends.
            await self._release_place(tenant, turn_id)
            await self.locks.release(conversation_id, turn_id=turn_id)
        await self._ended(conversation, turn, rows=rows, recorder=recorder)
        self._count(conversation, turn, started=started)

    async def _end_unrun(
        self,
        row: Turn,
        conversation: Conversation,
        *,
        status: schemas.TurnStatus,
        error: TurnError | None = None,
    ) -> schemas.TurnOut:
        """End a turn that will not run (cancelled before it started, superseded, or its runner died
        mid-way): its status, and its end event for watchers. Retried when a running turn takes the
        event seq first."""
        now = utcnow()
        row.status = status
        row.error = _error_json(error)
        row.finished_at = now
        row.lease_owner = row.lease_expires_at = None
        turn = self.turn_out(row, conversation)
        for attempt in range(3):
            recorder = TurnRecorder(
                conversation_id=conversation.id,
                turn_id=row.id,
                next_seq=await EventRepository(self.session).last_seq(conversation_id=conversation.id) + 1,
                bus=self.control.bus if self.control is not None else None,
                sessionmaker=None,
            )
            recorder.emit(_end_type(status), turn.model_dump(mode="json"))
            try:
                rows = await recorder.drain(self.session)
                await self.session.commit()
            except IntegrityError:
                await self.session.rollback()
                row = await self.session.merge(row)
                if attempt == 2:
                    raise
                continue
            await self._ended(conversation, turn, rows=rows, recorder=recorder)
            break
        await self._release_place(conversation.tenant, row.id)
        await self.locks.release(conversation.id, turn_id=row.id)
        return turn

    async def _watched_loop(
        self,
        conversation: Conversation,
        *,
        turn_id: str,
        history: Sequence[StoredMessage],
        new_messages: list[TranscriptMessage],
        resume: ResumeBlock | None,
        recorder: TurnRecorder,
        watch: bool,
    ) -> TurnOutcome:
        """The loop with its cancel signal registered and, for a stored conversation (``watch``),
        its lock and lease renewed and its row polled for a cancel."""
        with self._cancel_signal(turn_id) as cancel:
            async with (
                self._watch(conversation.id, turn_id=turn_id, cancel=cancel, tenant=conversation.tenant)
                if watch
                else self._keep_place(conversation.tenant, turn_id=turn_id)
            ):
                return await self._run_loop(
                    conversation,
                    turn_id=turn_id,
                    history=history,
                    new_messages=new_messages,
                    resume=resume,
                    events=recorder,
                    cancel=cancel,
                )

    @contextlib.contextmanager
    def _cancel_signal(self, turn_id: str) -> Iterator[asyncio.Event]:
        if self.control is None:
            yield asyncio.Event()
            return
        with self.control.running(turn_id) as event:
            yield event

    @contextlib.asynccontextmanager
    async def _keep_place(self, tenant: str, *, turn_id: str) -> AsyncIterator[None]:
        """While a new conversation's first turn runs (it has no lock to renew): renew its place
        among the tenant's concurrent turns, so a long turn does not lose it."""
        limiter = self.limiter
        if limiter is None or limiter.policy(tenant).max_concurrent_turns <= 0:
            yield
            return

        async def step() -> None:
            await limiter.renew_turn(tenant, turn_id)

        async with periodic.every(self.settings.lock_lease_seconds / 3, step, name=f"place {turn_id}"):
            yield

    @contextlib.asynccontextmanager
    async def _watch(
        self, conversation_id: str, *, turn_id: str, cancel: asyncio.Event, tenant: str | None = None
    ) -> AsyncIterator[None]:
        """While a turn runs: renew its conversation lock and its own lease, and notice a cancel
        recorded in the store (how a cancel reaches it without Redis, and a safety net with it)."""
        every = self.settings.lock_lease_seconds / 3
        poll = self.settings.cancel_poll_seconds
        owner = self.control.owner if self.control is not None else None
        lease = timedelta(seconds=self.settings.lock_lease_seconds)

        renewed = time.monotonic()

        async def step() -> None:
            nonlocal renewed
            if time.monotonic() - renewed >= every:
                renewed = time.monotonic()
                if not await self.locks.renew(conversation_id, turn_id=turn_id):
                    log.warning("lock_lost", conversation_id=conversation_id, turn_id=turn_id)
                if self.limiter is not None and tenant is not None:
                    await self.limiter.renew_turn(tenant, turn_id)
                if owner is not None and self.sessionmaker is not None:
                    async with self.sessionmaker() as session, session.begin():
                        await ConversationRepository(session).renew_turn(
                            turn_id=turn_id, owner=owner, until=utcnow() + lease
                        )
            if self.sessionmaker is not None and not cancel.is_set():
                async with self.sessionmaker() as session:
                    if await ConversationRepository(session).cancel_requested(turn_id=turn_id):
                        cancel.set()

        async with periodic.every(min(every, poll), step, name=f"watch {turn_id}"):
            yield

    def _turn_values(
        self,
        conversation: Conversation,
        *,
        turn_id: str,
        status: schemas.TurnStatus,
        request: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Every column of a turn as stored when it starts; ``running`` ones carry this process's lease."""
        now = utcnow()
        running = status == "running"
        return {
            "id": turn_id,
            "conversation_id": conversation.id,
            "status": status,
            "output": None,
            "error": None,
            "usage": Usage().model_dump(),
            "warnings": [],
            "version": conversation.version,
            "request": request,
            "background": status == "queued",
            "cancel_requested_at": None,
            "lease_owner": self.control.owner if running and self.control is not None else None,
            "lease_expires_at": (
                now + timedelta(seconds=self.settings.lock_lease_seconds) if running else None
            ),
            "started_at": now if running else None,
            "created_at": now,
            "finished_at": None,
        }

    # -- turns as resources --------------------------------------------------------------------

    def turn_out(self, row: Turn, conversation: Conversation) -> schemas.TurnOut:
        """A stored turn as the API shows it (its pending calls while the conversation waits on them)."""
        return self._turn_out(row, version=conversation.version, paused=conversation.paused)

    def _turn_out(self, row: Turn, *, version: int, paused: dict[str, Any] | None) -> schemas.TurnOut:
        """``turn_out`` of a conversation at ``version`` whose pause record is ``paused``."""
        usage = row.usage or {}
        waiting = row.status == "awaiting_tool_results" and version == row.version
        return schemas.TurnOut(
            conversation_id=row.conversation_id,
            turn_id=row.id,
            status=row.status,
            output=row.output,
            error=schemas.TurnErrorBody(**row.error) if row.error else None,
            usage=Usage.model_validate(usage),
            version=row.version,
            warnings=list(row.warnings or []),
            pending_tool_calls=_pending_out(_paused_record(paused)) if waiting and paused else [],
            background=row.background,
            cancel_requested=row.cancel_requested_at is not None,
            created_at=row.created_at,
            finished_at=row.finished_at,
        )

    async def get_turn(self, conversation: Conversation, *, turn_id: str) -> schemas.TurnOut:
        row = await self.repo.turn(conversation_id=conversation.id, turn_id=turn_id)
        if row is None:
            raise NotFound(f"No turn {turn_id!r} on conversation {conversation.id!r}.")
        return self.turn_out(row, conversation)

    async def list_turns(
        self, conversation: Conversation, *, before: str | None, limit: int
    ) -> schemas.TurnList:
        cursor = None
        if before is not None:
            cursor = await self.repo.turn(conversation_id=conversation.id, turn_id=before)
            if cursor is None:
                raise Unprocessable(f"before: no turn {before!r} on this conversation.")
        rows = await self.repo.turns(conversation_id=conversation.id, before=cursor, limit=limit + 1)
        page = rows[:limit]
        return schemas.TurnList(
            data=[self.turn_out(row, conversation) for row in page],
            has_more=len(rows) > limit,
            next_before=page[-1].id if len(rows) > limit else None,
        )

    async def cancel_turn(self, conversation: Conversation, *, turn_id: str, wait: float) -> schemas.TurnOut:
        """Stop a queued or running turn wherever it runs; the turn as it ended (or, if its runner has
        not stopped it within ``wait`` seconds, as it is, with ``cancel_requested``)."""
        row = await self.repo.turn(conversation_id=conversation.id, turn_id=turn_id)
        if row is None:
            raise NotFound(f"No turn {turn_id!r} on conversation {conversation.id!r}.")
        if row.status == "cancelled":
            return self.turn_out(row, conversation)
        if row.status not in ("queued", "running"):
            raise TurnFinished(
                f"Turn {turn_id} already ended ({row.status}); only a live turn can be cancelled.",
                extra={"current": {"status": row.status}},
            )
        now = utcnow()
        await self.repo.request_cancel(turn_id=turn_id, now=now)
        # Nobody runs it (still queued, or its runner died): it ends here.
        ended_here = await self.repo.finish_unclaimed(turn_id=turn_id, status="cancelled", now=now)
        await self.session.commit()
        if ended_here:
            await self.session.refresh(row)
            return await self._end_unrun(row, conversation, status="cancelled")
        if self.control is not None:
            await self.control.cancel(turn_id)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            await self.session.refresh(row)
            if row.status not in ("queued", "running"):
                break
            await self.session.commit()  # a fresh snapshot for the next read
            await asyncio.sleep(0.05)
        await self.session.refresh(conversation)
        return self.turn_out(row, conversation)

    async def recover(self, *, queued_after: timedelta) -> dict[str, str]:
        """Turns left behind: runners that died (lease expired) and turns queued for longer than
        ``queued_after``. Stored ones are run again; a waited-for turn whose server died ends
        ``failed`` (its client saw the connection drop and retries). The turns to run again, each
        id with its tenant."""
        now = utcnow()
        rerun: dict[str, str] = {}
        for row, tenant in await self.repo.stale_turns(now=now, queued_before=now - queued_after):
            if row.request is not None:
                rerun[row.id] = tenant
                continue
            if not await self.repo.finish_unclaimed(turn_id=row.id, status="failed", now=now):
                continue
            conversation = await self.session.get(Conversation, row.conversation_id)
            if conversation is not None:
                await self._end_unrun(
                    row,
                    conversation,
                    status="failed",
                    error=TurnError(
                        code="runner_lost",
                        message="The server running this turn stopped before it ended; send it again.",
                        retryable=True,
                    ),
                )
        await self.session.commit()
        return rerun

    async def _run_loop(
        self,
        conversation: Conversation,
        *,
        turn_id: str,
        history: Sequence[StoredMessage],
        new_messages: list[TranscriptMessage],
        resume: ResumeBlock | None,
        events: TurnRecorder | None = None,
        cancel: asyncio.Event | None = None,
    ) -> TurnOutcome:
        persona = self.personas.get(conversation.persona) or self.personas["default"]
        workdir = self._workdir(conversation.id)
        workdir.mkdir(parents=True, exist_ok=True)
        registry, warnings, request_tools = self._registry(persona, conversation)
        turn = TurnInput(
            conversation_id=conversation.id,
            turn_id=turn_id,
            tenant=conversation.tenant,
            system_prompt=build_prompt(persona, instructions=conversation.instructions, tools=request_tools),
            model=conversation.model or self.settings.model,
            history=history,
            new_messages=new_messages,
            snapshot=conversation.snapshot,
            max_iterations=conversation.max_iterations,
            workdir=workdir,
            limits=self._limits(persona),
            tools=registry,
            resume=resume,
            network=persona.network,
            tool_call_ttl=timedelta(seconds=self.settings.tool_call_ttl_seconds),
            events=events,
            cancel=cancel,
        )
        try:
            with tracing.span(
                "turn",
                {
                    "sabre.conversation_id": conversation.id,
                    "sabre.turn_id": turn_id,
                    "sabre.persona": persona.name,
                    "sabre.model": turn.model,
                },
            ) as span:
                outcome = await self.loop.run(turn)
                span.set_attribute("sabre.outcome", outcome.status)
            outcome.warnings = warnings + outcome.warnings
            return outcome
        except Exception:
            # A bug of ours must not lose the user's message or wedge the conversation.
            log.exception("turn_crashed", conversation_id=conversation.id, turn_id=turn_id)
            return TurnOutcome(
                status="failed",
                output=None,
                error=TurnError(
                    code="internal_error",
                    message="The turn failed unexpectedly; it has been logged.",
                    retryable=True,
                ),
                usage=Usage(),
                messages=new_messages,
                snapshot=conversation.snapshot,
            )

    async def _persist(
        self,
        conversation: Conversation,
        *,
        turn_id: str,
        outcome: TurnOutcome,
        recorder: TurnRecorder,
        new: bool = False,
        started: Turn | None = None,
        alone: bool = False,
    ) -> tuple[schemas.TurnOut, list[dict[str, Any]]]:
        """Phase 3: messages, the turn, the snapshot, totals and the turn's last events (its end
        event included), in the session's transaction; the event rows to publish once committed.
        ``new``: the first turn of a conversation created by this request (neither is stored yet);
        else ``started``: the turn's row as it was stored when it started. ``alone``: the caller
        writes nothing more before it commits, so a unit of one statement needs no transaction
        of its own (``autocommit_unit``)."""
        await recorder.stop_writing()  # before this transaction takes the store's write lock
        now = utcnow()
        seq = conversation.next_seq
        messages = [
            {
                "id": new_id("msg"),
                "conversation_id": conversation.id,
                "seq": seq + offset,
                "turn_id": turn_id,
                "role": message.role,
                "parts": message.dump_parts(),
                "created_at": now,
            }
            for offset, message in enumerate(outcome.messages)
        ]
        seq += len(messages)
        usage = outcome.usage
        version = conversation.version + 1
        finished: dict[str, Any] = {
            "status": outcome.status,
            "output": outcome.output,
            "error": _error_json(outcome.error),
            "usage": usage.model_dump(),
            "warnings": list(outcome.warnings),
            "version": version,
            "finished_at": now,
            "lease_owner": None,
            "lease_expires_at": None,
        }
        stored: dict[str, Any] = {
            "next_seq": seq,
            "version": version,
            "snapshot": outcome.snapshot,
            "paused": outcome.paused.to_store() if outcome.paused is not None else None,
            "status": "awaiting_tool_results" if outcome.paused is not None else "idle",
            "input_tokens": conversation.input_tokens + usage.input_tokens,
            "output_tokens": conversation.output_tokens + usage.output_tokens,
            "llm_calls": conversation.llm_calls + usage.llm_calls,
            "iterations": conversation.iterations + usage.iterations,
            "updated_at": now,
        }

        def ended_row(*, created_at: datetime, started_at: datetime | None, background: bool) -> Turn:
            """The turn's row as it ended, in full (no cancel request on it)."""
            return Turn(
                id=turn_id,
                conversation_id=conversation.id,
                background=background,
                request=None,
                cancel_requested_at=None,
                created_at=created_at,
                started_at=started_at,
                **finished,
            )

        def whole_turn() -> Turn:
            """Stored in full: with a new conversation, or again once its row went missing."""
            return ended_row(created_at=now, started_at=now, background=False)

        files = self._files(conversation, turn_id=turn_id, outcome=outcome, now=now)
        if alone and not files:
            await autocommit_unit(self.session)
        if new:  # neither is stored yet: both rows in full, with the turn's events
            for key, value in stored.items():
                setattr(conversation, key, value)
            row = whole_turn()
            turn = self.turn_out(row, conversation)  # built in memory: its end event goes in too
            recorder.emit(_end_type(outcome.status), turn.model_dump(mode="json"))
            rows = await recorder.take()
            await self.repo.insert_new(conversation, row, messages, events=rows)
            FileRepository(self.session).add_all(files)  # after their conversation's row (at the commit)
            return turn, rows
        # The turn as it ends, unless a cancel request came meanwhile (only its row knows): its
        # end event goes into the statement that stores the outcome, in both versions.
        assert started is not None, "a turn of a stored conversation was stored when it started"
        expected = ended_row(
            created_at=started.created_at, started_at=started.started_at, background=started.background
        )
        turn = self._turn_out(expected, version=version, paused=stored["paused"])
        end = turn.model_dump(mode="json")
        recorder.emit(_end_type(outcome.status), end)
        rows = await recorder.take()
        cancelled = {**end, "cancel_requested": True}
        # Checked against the version the turn started from: a turn whose lease lapsed and was
        # taken over must not overwrite the turn that took over, nor end its own row.
        ended = await self.repo.finish(
            conversation,
            seen_version=conversation.version,
            values=stored,
            turn_id=turn_id,
            finished=finished,
            messages=messages,
            events=rows,
            cancelled_end=cancelled,
        )
        if ended == "stale":
            raise TurnRunning("The conversation changed while this turn ran; its result was discarded.")
        if ended == "gone":  # its row went missing meanwhile: stored again, as it ended, then its events
            ended = whole_turn()
            self.session.add(ended)
            turn = self.turn_out(ended, conversation)
            rows[-1] = {**rows[-1], "data": turn.model_dump(mode="json")}
            await EventRepository(self.session).append(rows)
        elif ended.cancel_requested_at is not None:  # stored with the end event that says so
            turn = self.turn_out(ended, conversation)
            rows[-1] = {**rows[-1], "data": cancelled}
        FileRepository(self.session).add_all(files)
        return turn, rows

    @staticmethod
    def _files(
        conversation: Conversation, *, turn_id: str, outcome: TurnOutcome, now: datetime
    ) -> list[StoredFile]:
        """The figures the turn's blocks drew, as rows to store."""
        return [
            StoredFile(
                id=file_id,
                tenant=conversation.tenant,
                conversation_id=conversation.id,
                turn_id=turn_id,
                content_type="image/png",
                size=len(png),
                data=png,
                created_at=now,
            )
            for message in outcome.messages
            for part in message.parts
            if isinstance(part, HelpersResultPart)
            for file_id, png in zip(part.files, message.images, strict=True)
        ]

    # -- helpers -------------------------------------------------------------------------------

    def _paused(self, conversation: Conversation) -> PausedBlock:
        """The stored pause record; one written by an unknown version is refused, not guessed at."""
        return _paused_record(conversation.paused)

    def _registry(
        self, persona: Persona, conversation: Conversation
    ) -> tuple[ToolRegistry, list[str], list[FunctionToolDoc]]:
        """The conversation's tools: the persona's external and MCP tools, then the request's (which win)."""
        registry = ToolRegistry()
        warnings: list[str] = []
        for custom in persona.custom_tools:
            # External: the caller runs it. MCP: the app's McpManager runs it (app/tools/mcp.py).
            # Python: the sandbox runs it next to the code.
            ref = custom.ref
            handler = None
            if isinstance(ref, McpRef):
                if self.mcp is None:
                    continue  # a service built without MCP (the app always has a manager)
                handler = self.mcp.handler(ref.server, ref.tool)
            sandbox = sandbox_tool(custom, ref) if isinstance(ref, PythonRef) else None
            registry.register(
                make_tool(
                    name=custom.name,
                    description=custom.description,
                    parameters=custom.parameters,
                    handler=handler,
                    sandbox=sandbox,
                )
            )
        docs: list[FunctionToolDoc] = []
        for definition in conversation.tools:
            if registry.get(definition["name"]) is not None:
                warnings.append(
                    f"tool {definition['name']!r} from the request replaces the persona's tool of that name"
                )
            registry.register(make_tool(**definition))
            docs.append(FunctionToolDoc(**definition))
        return registry, warnings, docs

    def _check_input(self, text: str) -> None:
        limit = self.settings.max_input_chars
        if len(text) > limit:
            raise PayloadTooLarge(
                f"input: {len(text)} characters; the limit is {limit} (SABRE_MAX_INPUT_CHARS)."
            )

    def _workdir(self, conversation_id: str) -> Path:
        return self.settings.workspaces_dir / conversation_id

    def _limits(self, persona: Persona) -> Limits:
        """The service's block limits, with the persona's own where it sets them."""
        limits = self.settings.block_limits
        if persona.limits is None:
            return limits
        return limits.model_copy(update=persona.limits.model_dump(exclude_none=True))


Delivery = Literal["wait", "stream", "background"]


def delivery_of(body: schemas.TurnRequest) -> Delivery:
    """How the caller wants the turn: ``background`` (with or without ``stream``) runs on a job
    worker and outlives the request; ``stream`` alone runs here, detached, while events stream."""
    if body.background:
        return "background"
    return "stream" if body.stream else "wait"


def _record_start(
    recorder: TurnRecorder, *, turn_id: str, new_messages: list[TranscriptMessage], resume: ResumeBlock | None
) -> None:
    recorder.emit("turn.started", {"turn_id": turn_id, "resumes_block": resume is not None})
    results = [
        {"tool_call_id": part.tool_call_id, "output": part.output, "error": part.error}
        for message in new_messages
        for part in message.parts
        if isinstance(part, ToolResultPart) and not part.seeded
    ]
    if results:
        recorder.emit("tool_results.received", {"results": results})


def _stored_request(new_messages: list[TranscriptMessage], resume: ResumeBlock | None) -> dict[str, Any]:
    """What a detached turn runs, as JSON for its row: its new messages and the block it resumes."""
    return {
        "v": 1,
        "messages": [{"role": m.role, "parts": m.dump_parts()} for m in new_messages],
        "resume": resume.model_dump(mode="json") if resume is not None else None,
    }


def _load_request(stored: dict[str, Any]) -> tuple[list[TranscriptMessage], ResumeBlock | None]:
    if stored.get("v") != 1:
        raise ValueError(f"unknown stored turn request version {stored.get('v')!r}")
    messages = [TranscriptMessage(role=m["role"], parts=load_parts(m["parts"])) for m in stored["messages"]]
    resume = ResumeBlock.model_validate(stored["resume"]) if stored.get("resume") else None
    return messages, resume


def _error_json(error: TurnError | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"code": error.code, "message": error.message, "retryable": error.retryable}


def _paused_record(paused: dict[str, Any] | None) -> PausedBlock:
    """A stored pause record; one written by an unknown version is refused, not guessed at."""
    try:
        return PausedBlock.from_store(paused or {})
    except ValidationError as exc:
        raise Conflict(
            "The paused turn of this conversation was stored by an incompatible version of SABRE "
            "and cannot be resumed; send a new message after deleting it.",
        ) from exc


def _end_type(status: str) -> EventType:
    """The event that ends a turn of this status."""
    ends: dict[str, EventType] = {
        "completed": "turn.completed",
        "awaiting_tool_results": "turn.awaiting_tool_results",
        "failed": "turn.failed",
        "cancelled": "turn.cancelled",
    }
    return ends[status]


def seeded_transcript(
    messages: Sequence[schemas.HistoryUser | schemas.HistoryAssistant | schemas.HistoryTool],
    *,
    max_chars: int,
    max_output_bytes: int,
) -> list[TranscriptMessage]:
    """A history a conversation starts from, checked and as transcript messages (422 naming the
    first bad message): each tool call answered exactly once, by ``tool`` messages right after its
    assistant message; ids unique; texts and outputs within the service's limits."""
    transcript: list[TranscriptMessage] = []
    open_calls: dict[str, int] = {}  # id -> the index of the assistant message that made it
    seen: set[str] = set()
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if message.role != "tool" and open_calls:
            made_by = next(iter(open_calls.values()))
            raise InvalidHistory(
                f"{where}: the tool calls {', '.join(open_calls)} of messages.{made_by} have no `tool` "
                "message before this one."
            )
        if message.role == "user":
            _check_history_text(message.content, where=where, limit=max_chars)
            transcript.append(_user_text(message.content))
        elif message.role == "assistant":
            parts: list[TextPart | ToolCallPart] = []
            if message.content and message.content.strip():
                _check_history_text(message.content, where=where, limit=max_chars)
                parts.append(TextPart(text=message.content))
            for call in message.tool_calls:
                if call.id in seen:
                    raise InvalidHistory(
                        f"{where}: the tool call id {call.id!r} is used twice in the history."
                    )
                seen.add(call.id)
                open_calls[call.id] = index
                _check_history_output(call.arguments, where=f"{where}.tool_calls", limit=max_output_bytes)
                parts.append(
                    ToolCallPart(
                        id=call.id,
                        name=call.name,
                        arguments=call.arguments,
                        code=_call_code(call.name, call.arguments),
                        seeded=True,
                    )
                )
            transcript.append(TranscriptMessage(role="assistant", parts=list(parts)))
        else:
            if open_calls.pop(message.tool_call_id, None) is None:
                raise InvalidHistory(
                    f"{where}: tool_call_id {message.tool_call_id!r} answers no unanswered tool call of the "
                    "assistant message before it."
                )
            if message.error is None:
                _check_history_output(message.output, where=where, limit=max_output_bytes)
            result = ToolResultPart(
                tool_call_id=message.tool_call_id, output=message.output, error=message.error, seeded=True
            )
            previous = transcript[-1]
            if previous.role == "user" and all(isinstance(p, ToolResultPart) for p in previous.parts):
                previous.parts.append(result)  # the results of one assistant message, together
            else:
                transcript.append(TranscriptMessage(role="user", parts=[result]))
    if open_calls:
        raise InvalidHistory(
            f"messages: the tool calls {', '.join(open_calls)} have no `tool` message; a history ends "
            "with every call answered (the new `input` follows it)."
        )
    return transcript


def _check_history_text(text: str, *, where: str, limit: int) -> None:
    if len(text) > limit:
        raise PayloadTooLarge(
            f"{where}: {len(text)} characters; the limit is {limit} (SABRE_MAX_INPUT_CHARS)."
        )


def _check_history_output(value: Any, *, where: str, limit: int) -> None:
    size = len(json.dumps(value, ensure_ascii=False).encode())
    if size > limit:
        raise PayloadTooLarge(
            f"{where}: {size} bytes of JSON; the limit is {limit} (SABRE_MAX_TOOL_OUTPUT_BYTES)."
        )


def _call_code(name: str, arguments: dict[str, Any]) -> str:
    """A history's tool call as the Python call the model would write (``name(key=value)``)."""
    if all(key.isidentifier() and not keyword.iskeyword(key) for key in arguments):
        return f"{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"
    return f"{name}(**{arguments!r})"


def _user_text(text: str) -> TranscriptMessage:
    return TranscriptMessage(role="user", parts=[TextPart(text=text)])


def _expired(paused: PausedBlock) -> bool:
    now = utcnow()
    return any(p.expires_at <= now for p in paused.pending)


def _pending_out(paused: PausedBlock | None) -> list[schemas.PendingToolCall]:
    if paused is None:
        return []
    return [
        schemas.PendingToolCall(
            id=p.id, name=p.call.name, arguments=p.call.arguments, code=p.call.code, expires_at=p.expires_at
        )
        for p in paused.pending
    ]


# Tool names may not shadow a helper, a helper group (``FS``, ``Search``…) or the runtime's own names.
RESERVED_NAMES = frozenset(HELPERS) | {name.split(".", 1)[0] for name in HELPERS} | RUNTIME_NAMES


def _check_merged_tools(tools: Sequence[Mapping[str, Any]]) -> None:
    """422 when a message's tools, with those the conversation has, pass what one request may declare:
    every turn renders and checks them all, so adding some with each message grew both without end."""
    if len(tools) > schemas.MAX_TOOLS:
        raise InvalidTool(
            f"tools: the conversation would have {len(tools)} tools; the limit is {schemas.MAX_TOOLS}"
        )
    try:
        check_request_size(t["parameters"] for t in tools)
    except SchemaProblem as exc:
        raise InvalidTool(f"tools: with the conversation's own, {exc}") from exc


async def _checked_tools(tools: Sequence[schemas.ToolIn], *, field: str) -> list[dict[str, Any]]:
    """``_tool_definitions`` once the tools' size is checked (422 past the request's bound), in the
    schema-checking thread when they are large (``off_loop``): their meta-schema check would hold
    the event loop for up to ~0.6 s."""
    try:
        nodes = check_request_size(tool.definition().parameters for tool in tools)
    except SchemaProblem as exc:
        raise InvalidTool(f"{field}: {exc}") from exc
    if nodes > INLINE_SCHEMA_NODES:
        return await off_loop(functools.partial(_tool_definitions, tools, field=field))
    return _tool_definitions(tools, field=field)


def _tool_definitions(tools: Sequence[schemas.ToolIn], *, field: str) -> list[dict[str, Any]]:
    """Validated, normalised tool definitions (one shape) for the store; 422 naming the bad one.
    Their size is checked first (``_checked_tools``)."""
    seen: set[str] = set()
    definitions: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        definition = tool.definition()
        try:
            make_tool(
                name=definition.name,
                description=definition.description,
                parameters=definition.parameters,
                reserved=RESERVED_NAMES,
            )
        except ToolDefinitionError as exc:
            raise InvalidTool(f"{field}.{index}: {exc}") from exc
        if definition.name in seen:
            raise InvalidTool(f"{field}.{index}: tool {definition.name!r} is declared twice")
        seen.add(definition.name)
        definitions.append(
            {
                "name": definition.name,
                "description": definition.description,
                "parameters": definition.parameters or {"type": "object", "properties": {}},
            }
        )
    return definitions
