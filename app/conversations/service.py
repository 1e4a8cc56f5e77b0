"""The rules of the conversations API: who may do what, in which state, and how a turn is persisted.

A turn spans three phases so that no database connection is held while the model thinks:
load and lock (short transaction), run the loop (no transaction), persist (one transaction).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.exc import StaleDataError

from app.config import Settings
from app.conversations import schemas
from app.conversations.locks import ConversationLocks, keep_alive
from app.conversations.repository import ConversationRepository
from app.helpers import Usage
from app.kit.clock import utcnow
from app.kit.errors import Conflict, NotFound, PayloadTooLarge, Unprocessable
from app.kit.idempotency import Idempotency
from app.kit.ids import new_id
from app.models import Conversation, Message, Turn
from app.orchestrator.loop import TurnError, TurnInput, TurnLoop, TurnOutcome
from app.orchestrator.messages import TextPart, TranscriptMessage, load_parts
from app.personas.models import Persona
from app.personas.prompt import build_prompt
from app.runtime import Limits

log = structlog.get_logger(__name__)


class TurnRunning(Conflict):
    code = "turn_in_progress"
    title = "A turn is already running on this conversation"


class UnknownPersona(Unprocessable):
    code = "unknown_persona"
    title = "Unknown persona"


@dataclass(slots=True)
class ConversationService:
    """One request's view of the conversations domain (built per request by the dependency)."""

    session: AsyncSession
    settings: Settings
    personas: dict[str, Persona]
    loop: TurnLoop
    locks: ConversationLocks

    @property
    def repo(self) -> ConversationRepository:
        return ConversationRepository(self.session)

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
            usage=schemas.Usage(
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
                    role=m.role,  # type: ignore[arg-type]
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
        self._check_input(body.input)
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
            tools=[],
            status="idle",
            version=0,
            next_seq=0,
            lock_turn_id=None,
            created_at=now,
            updated_at=now,
        )
        self.repo.add(conversation)
        await self.session.commit()
        return await self._run_turn(
            conversation, turn_id=turn_id, user_input=body.input, idempotency=idempotency, status_code=201
        )

    async def post_message(
        self,
        conversation: Conversation,
        *,
        body: schemas.PostMessage,
        idempotency: Idempotency | None = None,
    ) -> schemas.TurnOut:
        """Run a turn for the next user message."""
        self._check_input(body.input)
        if conversation.status == "awaiting_tool_results":
            raise Conflict(
                "This conversation is waiting for tool results: POST them to "
                f"/v1/conversations/{conversation.id}/tool-results first.",
                extra={"current": {"status": conversation.status}},
            )
        return await self._run_turn(
            conversation, turn_id=new_id("turn"), user_input=body.input, idempotency=idempotency
        )

    async def delete(self, *, tenant: str, conversation_id: str) -> None:
        """Delete a conversation, its transcript, turns and working directory."""
        conversation = await self.get(tenant=tenant, conversation_id=conversation_id)
        holder = await self.locks.holder(conversation.id)
        if holder is not None:
            raise TurnRunning(
                f"Turn {holder} is running on this conversation; delete it when it ends.",
                extra={"current": {"turn_id": holder}},
            )
        await self.repo.delete(conversation)
        await self.session.flush()
        shutil.rmtree(self._workdir(conversation.id), ignore_errors=True)

    # -- the turn ------------------------------------------------------------------------------

    async def _run_turn(
        self,
        conversation: Conversation,
        *,
        turn_id: str,
        user_input: str,
        idempotency: Idempotency | None,
        status_code: int = 200,
    ) -> schemas.TurnOut:
        holder = await self.locks.acquire(conversation.id, turn_id=turn_id)
        if holder is not None:
            raise TurnRunning(
                f"Turn {holder} is running on this conversation; retry when it has finished.",
                extra={"current": {"turn_id": holder}},
            )
        try:
            async with keep_alive(
                self.locks,
                conversation.id,
                turn_id=turn_id,
                every=self.settings.lock_lease_seconds / 3,
            ):
                history = await self._history(conversation)
                # Phase 1 ends: release the connection while the model and the sandbox work.
                await self.session.commit()
                outcome = await self._run_loop(
                    conversation, turn_id=turn_id, history=history, user_input=user_input
                )
                turn = await self._persist(conversation, turn_id=turn_id, outcome=outcome)
                if idempotency is not None:
                    await idempotency.complete(
                        self.session, status_code=status_code, body=turn.model_dump(mode="json")
                    )
                # Commit before the lock is released: the next turn must see this one's state.
                await self.session.commit()
                return turn
        finally:
            await self.locks.release(conversation.id, turn_id=turn_id)

    async def _run_loop(
        self,
        conversation: Conversation,
        *,
        turn_id: str,
        history: Sequence[TranscriptMessage],
        user_input: str,
    ) -> TurnOutcome:
        persona = self.personas.get(conversation.persona) or self.personas["default"]
        workdir = self._workdir(conversation.id)
        workdir.mkdir(parents=True, exist_ok=True)
        user = TranscriptMessage(role="user", parts=[TextPart(text=user_input)])
        turn = TurnInput(
            conversation_id=conversation.id,
            turn_id=turn_id,
            system_prompt=build_prompt(persona, instructions=conversation.instructions),
            model=conversation.model or self.settings.model,
            history=history,
            new_messages=[user],
            snapshot=conversation.snapshot,
            max_iterations=conversation.max_iterations,
            workdir=workdir,
            limits=self._limits(),
        )
        try:
            return await self.loop.run(turn)
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
                messages=[user],
                snapshot=conversation.snapshot,
            )

    async def _persist(
        self, conversation: Conversation, *, turn_id: str, outcome: TurnOutcome
    ) -> schemas.TurnOut:
        """Phase 3: messages, the turn, the snapshot and totals, in the request's transaction."""
        now = utcnow()
        rows: list[Message | Turn] = []
        seq = conversation.next_seq
        for message in outcome.messages:
            rows.append(
                Message(
                    id=new_id("msg"),
                    conversation_id=conversation.id,
                    seq=seq,
                    turn_id=turn_id,
                    role=message.role,
                    parts=message.dump_parts(),
                    created_at=now,
                )
            )
            seq += 1
        usage = outcome.usage
        version = conversation.version + 1
        error = (
            {
                "code": outcome.error.code,
                "message": outcome.error.message,
                "retryable": outcome.error.retryable,
            }
            if outcome.error
            else None
        )
        rows.append(
            Turn(
                id=turn_id,
                conversation_id=conversation.id,
                status=outcome.status,
                output=outcome.output,
                error=error,
                usage={
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                    "llm_calls": usage.llm_calls,
                    "iterations": usage.iterations,
                },
                warnings=outcome.warnings,
                version=version,
                created_at=now,
                finished_at=now,
            )
        )
        self.repo.add_all(rows)
        conversation.next_seq = seq
        conversation.version = version
        conversation.snapshot = outcome.snapshot
        conversation.status = "awaiting_tool_results" if outcome.status == "awaiting_tool_results" else "idle"
        conversation.input_tokens += usage.input_tokens
        conversation.output_tokens += usage.output_tokens
        conversation.llm_calls += usage.llm_calls
        conversation.iterations += usage.iterations
        conversation.updated_at = now
        try:
            await self.session.flush()
        except StaleDataError as exc:
            raise TurnRunning(
                "The conversation changed while this turn ran; its result was discarded."
            ) from exc
        return schemas.TurnOut(
            conversation_id=conversation.id,
            turn_id=turn_id,
            status=outcome.status,
            output=outcome.output,
            error=schemas.TurnErrorBody(**error) if error else None,
            usage=schemas.Usage(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                llm_calls=usage.llm_calls,
                iterations=usage.iterations,
            ),
            version=version,
            warnings=outcome.warnings,
        )

    # -- helpers -------------------------------------------------------------------------------

    async def _history(self, conversation: Conversation) -> list[TranscriptMessage]:
        rows = await self.repo.messages(conversation_id=conversation.id)
        return [
            TranscriptMessage(role=row.role, parts=load_parts(row.parts))  # type: ignore[arg-type]
            for row in rows
        ]

    def _check_input(self, text: str) -> None:
        limit = self.settings.max_input_chars
        if len(text) > limit:
            raise PayloadTooLarge(
                f"input: {len(text)} characters; the limit is {limit} (SABRE_MAX_INPUT_CHARS)."
            )

    def _workdir(self, conversation_id: str) -> Path:
        return self.settings.workspaces_dir / conversation_id

    def _limits(self) -> Limits:
        s = self.settings
        return Limits(
            cpu_seconds=s.block_cpu_seconds,
            memory_mb=s.block_memory_mb,
            wall_clock_seconds=s.block_wall_clock_seconds,
            stdout_bytes=s.block_stdout_bytes,
        )
