"""The rules of the conversations API: who may do what, in which state, and how a turn is persisted.

A turn spans three phases so that no database connection is held while the model thinks:
load and lock (short transaction), run the loop (no transaction), persist (one transaction).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.exc import StaleDataError

from app.config import Settings
from app.conversations import schemas
from app.conversations.locks import ConversationLocks, keep_alive
from app.conversations.repository import ConversationRepository
from app.helpers import HELPERS, Usage
from app.kit.clock import utcnow
from app.kit.errors import Conflict, Gone, NotFound, PayloadTooLarge, Unprocessable
from app.kit.idempotency import Idempotency
from app.kit.ids import new_id
from app.kit.metrics import LLM_TOKENS, TURN_SECONDS, TURNS
from app.models import Conversation, StoredFile, Turn
from app.orchestrator.loop import TurnError, TurnInput, TurnLoop, TurnOutcome
from app.orchestrator.messages import (
    HelpersResultPart,
    TextPart,
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
from app.tools.mcp import McpManager
from app.tools.registry import ToolDefinitionError, ToolRegistry, make_tool

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
    mcp: McpManager | None = None

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
            pending_tool_calls=_pending_out(self._paused(conversation)) if conversation.paused else [],
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
        self._check_input(body.input)
        tools = _tool_definitions(body.tools, field="tools")
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
            new_messages=[_user_text(body.input)],
            idempotency=idempotency,
            status_code=201,
            new=True,
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
            conversation.paused = None
        if body.tools is not None:
            merged = {t["name"]: t for t in conversation.tools}
            merged.update({t["name"]: t for t in _tool_definitions(body.tools, field="tools")})
            conversation.tools = list(merged.values())
        return await self._run_turn(
            conversation, turn_id=new_id("turn"), new_messages=new_messages, idempotency=idempotency
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
        journal = list(paused.journal)
        parts: list[ToolResultPart] = []
        for pending in paused.pending:
            result = by_id[pending.id]
            reply = (
                CallReply(kind="error", error_type="ToolError", error_message=result.error)
                if result.error is not None
                else CallReply(kind="value", value=result.output)
            )
            journal.append(pending.answered(reply))
            parts.append(ToolResultPart(tool_call_id=pending.id, output=result.output, error=result.error))
        # The paused record stays stored until the turn's outcome replaces it (in _persist): a
        # server that dies during the resume leaves the conversation resumable, not wedged.
        return await self._run_turn(
            conversation,
            turn_id=new_id("turn"),
            new_messages=[TranscriptMessage(role="user", parts=list(parts))],
            resume=ResumeBlock(code=paused.code, journal=journal, note=paused.note),
            idempotency=idempotency,
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
        new_messages: list[TranscriptMessage],
        idempotency: Idempotency | None,
        resume: ResumeBlock | None = None,
        status_code: int = 200,
        new: bool = False,
    ) -> schemas.TurnOut:
        """Lock, run the loop, persist. A ``new`` conversation is stored with its first turn, in one
        transaction: nobody knows its id before the response, so it needs no lock and has no history."""
        started = time.perf_counter()
        if not new:
            seen_version = conversation.version
            holder = await self.locks.acquire(conversation.id, turn_id=turn_id)
            if holder is not None:
                raise TurnRunning(
                    f"Turn {holder} is running on this conversation; retry when it has finished.",
                    extra={"current": {"turn_id": holder}},
                )
        try:
            history: list[StoredMessage] = []
            if not new:
                # What we read before taking the lock may be stale: another turn may have finished.
                if await self.repo.current_version(conversation_id=conversation.id) != seen_version:
                    raise Conflict(
                        "The conversation changed while this request waited; read it again and retry.",
                        extra={"current": {"version": seen_version + 1}},
                    )
                history = await self.repo.history(conversation_id=conversation.id)
                # Phase 1 ends: release the connection while the model and the sandbox work.
                await self.session.commit()
            async with (
                keep_alive(
                    self.locks, conversation.id, turn_id=turn_id, every=self.settings.lock_lease_seconds / 3
                )
                if not new
                else contextlib.nullcontext()
            ):
                outcome = await self._run_loop(
                    conversation, turn_id=turn_id, history=history, new_messages=new_messages, resume=resume
                )
            if new:
                self.repo.add(conversation)
            turn = await self._persist(conversation, turn_id=turn_id, outcome=outcome)
            if idempotency is not None:
                await idempotency.complete(
                    self.session, status_code=status_code, body=turn.model_dump(mode="json")
                )
            # Commit before the lock is released: the next turn must see this one's state.
            await self.session.commit()
        finally:
            if not new:
                await self.locks.release(conversation.id, turn_id=turn_id)
        TURNS.labels(status=turn.status).inc()
        TURN_SECONDS.observe(time.perf_counter() - started)
        LLM_TOKENS.labels(direction="input").inc(turn.usage.input_tokens)
        LLM_TOKENS.labels(direction="output").inc(turn.usage.output_tokens)
        return turn

    async def _run_loop(
        self,
        conversation: Conversation,
        *,
        turn_id: str,
        history: Sequence[StoredMessage],
        new_messages: list[TranscriptMessage],
        resume: ResumeBlock | None,
    ) -> TurnOutcome:
        persona = self.personas.get(conversation.persona) or self.personas["default"]
        workdir = self._workdir(conversation.id)
        workdir.mkdir(parents=True, exist_ok=True)
        registry, warnings, request_tools = self._registry(persona, conversation)
        turn = TurnInput(
            conversation_id=conversation.id,
            turn_id=turn_id,
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
        )
        try:
            outcome = await self.loop.run(turn)
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
        self, conversation: Conversation, *, turn_id: str, outcome: TurnOutcome
    ) -> schemas.TurnOut:
        """Phase 3: messages, the turn, the snapshot and totals, in the request's transaction."""
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
        error = (
            {
                "code": outcome.error.code,
                "message": outcome.error.message,
                "retryable": outcome.error.retryable,
            }
            if outcome.error
            else None
        )
        self.repo.add_all(
            [
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
            ]
        )
        conversation.next_seq = seq
        conversation.version = version
        conversation.snapshot = outcome.snapshot
        conversation.paused = outcome.paused.to_store() if outcome.paused is not None else None
        conversation.status = "awaiting_tool_results" if outcome.paused is not None else "idle"
        conversation.input_tokens += usage.input_tokens
        conversation.output_tokens += usage.output_tokens
        conversation.llm_calls += usage.llm_calls
        conversation.iterations += usage.iterations
        conversation.updated_at = now
        self.session.add_all(
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
        )
        try:
            await self.session.flush()
            await self.repo.insert_messages(messages)
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
            pending_tool_calls=_pending_out(outcome.paused),
        )

    # -- helpers -------------------------------------------------------------------------------

    def _paused(self, conversation: Conversation) -> PausedBlock:
        """The stored pause record; one written by an unknown version is refused, not guessed at."""
        try:
            return PausedBlock.from_store(conversation.paused or {})
        except ValidationError as exc:
            raise Conflict(
                "The paused turn of this conversation was stored by an incompatible version of SABRE "
                "and cannot be resumed; send a new message after deleting it.",
            ) from exc

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
                    mode=custom.execution_mode,
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
            registry.register(make_tool(mode="external", **definition))
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
        s = self.settings
        limits = Limits(
            cpu_seconds=s.block_cpu_seconds,
            memory_mb=s.block_memory_mb,
            wall_clock_seconds=s.block_wall_clock_seconds,
            stdout_bytes=s.block_stdout_bytes,
            max_processes=s.block_max_processes,
            file_size_mb=s.block_file_size_mb,
            open_files=s.block_open_files,
            snapshot_bytes=s.block_snapshot_bytes,
            disk_mb=s.block_disk_mb,
            disk_files=s.block_disk_files,
        )
        if persona.limits is None:
            return limits
        return limits.model_copy(update=persona.limits.model_dump(exclude_none=True))


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
RESERVED_NAMES = (
    frozenset(HELPERS) | {name.split(".", 1)[0] for name in HELPERS} | {"ToolError", "print", "result"}
)


def _tool_definitions(tools: Sequence[schemas.ToolIn], *, field: str) -> list[dict[str, Any]]:
    """Validated, normalised tool definitions (one shape) for the store; 422 naming the bad one."""
    seen: set[str] = set()
    definitions: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        definition = tool.definition()
        try:
            make_tool(
                name=definition.name,
                description=definition.description,
                parameters=definition.parameters,
                mode="external",
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
