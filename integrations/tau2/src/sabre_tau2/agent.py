"""SABRE as a tau2-bench agent (tau2's ``HalfDuplexAgent``), driven over HTTP.

One tau2 simulation is one SABRE conversation. The domain's tools become the conversation's external
tools and its policy the conversation's instructions. A user message starts a turn; when the turn
pauses on tool calls, the agent answers tau2 with one assistant message carrying all of them (tau2 runs
them and hands back a ``MultiToolMessage`` when there are several), and the tool messages go back to
SABRE as the results of those calls, in one POST. A completed turn's output is the message to the user.
A history tau2 starts the agent with (``get_init_state(message_history)``) seeds the conversation.

Configuration: ``--agent-llm PERSONA[:MODEL]`` (``sabre`` alone: the ``default`` persona and the
server's model); ``--agent-llm-args`` may hold ``base_url``, ``api_key``, ``persona``, ``model``,
``max_iterations``, ``timeout``, ``retries`` (of a request that found no server or a 502-504: 4,
over 7.5 s, with the same Idempotency-Key); otherwise ``SABRE_URL`` (default http://127.0.0.1:8011) and
``SABRE_API_KEY``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any, Final

import httpx
from pydantic import BaseModel, Field
from tau2.agent.base_agent import AgentError, HalfDuplexAgent, ValidAgentInputMessage
from tau2.data_model.message import (
    AssistantMessage,
    Message,
    MultiToolMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from tau2.environment.tool import Tool

AGENT_NAME: Final = "sabre"
INSTRUCTIONS: Final = """\
You are a customer service agent. Help the user according to the policy below, using the tools \
given to you as functions. Each reply you give is sent to the user as it is: ask for what you need, \
tell them what you did. Transfer to a human agent only as the policy says.

<policy>
{policy}
</policy>"""
RETRY_DELAYS: Final = (0.5, 1.0, 2.0, 4.0)


class SabreAgentState(BaseModel):
    """What the agent keeps between tau2 steps: the conversation and counters for the report."""

    conversation_id: str | None = None
    history: list[dict[str, Any]] = Field(default_factory=list)
    """A history tau2 gave at start, as SABRE's seeded ``messages``: sent with the first turn."""
    round_trips: int = 0
    pauses: int = 0
    tool_calls: int = 0
    sabre_seconds: float = 0.0


class SabreAgent(HalfDuplexAgent[SabreAgentState]):
    """A tau2 agent whose every reply is a SABRE turn (or the pause of one)."""

    def __init__(
        self,
        tools: list[Tool],
        domain_policy: str,
        *,
        base_url: str,
        api_key: str | None = None,
        persona: str = "default",
        model: str | None = None,
        max_iterations: int | None = None,
        timeout: float = 600.0,
        seed_history: bool = True,
        retries: int = len(RETRY_DELAYS),
    ) -> None:
        super().__init__(tools=tools, domain_policy=domain_policy)
        self.persona = persona
        self.model = model
        self.max_iterations = max_iterations
        self.seed_history = seed_history
        self.retry_delays = RETRY_DELAYS[: max(0, retries)]
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=httpx.Timeout(timeout, connect=10.0)
        )

    # -- tau2's interface ---------------------------------------------------------------------------

    def get_init_state(self, message_history: list[Message] | None = None) -> SabreAgentState:
        """A state with no conversation yet; a prior dialogue (beyond tau2's greeting) is kept to seed it."""
        return SabreAgentState(history=seed_history(message_history or []))

    def generate_next_message(
        self, message: ValidAgentInputMessage, state: SabreAgentState
    ) -> tuple[AssistantMessage, SabreAgentState]:
        """Run the turn the message calls for; the pending calls or the answer, as tau2's message."""
        if isinstance(message, UserMessage):
            text = message.content or ""
            if state.conversation_id is None:
                turn = self._post(state, "/v1/conversations", self._create_body(text, state))
                state.conversation_id = turn["conversation_id"]
            else:
                turn = self._post(
                    state, f"/v1/conversations/{state.conversation_id}/messages", {"input": text}
                )
        else:
            if state.conversation_id is None:
                raise AgentError("tool results before any conversation: the simulation sent them first")
            tool_messages = message.tool_messages if isinstance(message, MultiToolMessage) else [message]
            results = [tool_result(m) for m in tool_messages]
            turn = self._post(
                state, f"/v1/conversations/{state.conversation_id}/tool-results", {"results": results}
            )
        return self._reply(turn, state), state

    def stop(
        self, message: ValidAgentInputMessage | None = None, state: SabreAgentState | None = None
    ) -> None:
        """Close the HTTP connections (the conversation stays in SABRE, to be read later)."""
        self._http.close()

    # -- SABRE --------------------------------------------------------------------------------------

    def _create_body(self, text: str, state: SabreAgentState) -> dict[str, Any]:
        body: dict[str, Any] = {
            "input": text,
            "persona": self.persona,
            "instructions": INSTRUCTIONS.format(policy=self.domain_policy),
            "tools": [tool.openai_schema for tool in self.tools],
            "metadata": {"runner": "sabre-tau2"},
        }
        if state.history:
            if self.seed_history:
                body["messages"] = state.history
            else:  # a server without seeded conversations: the dialogue so far as text
                body["input"] = f"{transcript(state.history)}\n\nThe user now says:\n{text}"
        if self.model:
            body["model"] = self.model
        if self.max_iterations:
            body["max_iterations"] = self.max_iterations
        return body

    def _post(self, state: SabreAgentState, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with retries under one Idempotency-Key (never two turns): a lost connection or a
        502-504 is retried, and a retry that finds the first attempt's turn still running waits for it."""
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        began = time.perf_counter()
        failures = 0
        try:
            while True:
                try:
                    response = self._http.post(path, json=body, headers=headers)
                except httpx.TransportError as exc:
                    if failures == len(self.retry_delays):
                        raise AgentError(f"SABRE unreachable at {self._http.base_url}: {exc}") from None
                    time.sleep(self.retry_delays[failures])
                    failures += 1
                    continue
                waiting = time.perf_counter() - began < self.timeout
                if response.status_code == 409 and _code(response) == "idempotency_in_progress" and waiting:
                    time.sleep(2.0)
                    continue
                if response.status_code in (502, 503, 504) and failures < len(self.retry_delays):
                    time.sleep(self.retry_delays[failures])
                    failures += 1
                    continue
                if response.status_code >= 400:
                    raise AgentError(f"SABRE answered {response.status_code}: {_problem(response)}")
                turn: dict[str, Any] = response.json()
                return turn
        finally:
            state.round_trips += 1
            state.sabre_seconds += time.perf_counter() - began

    def _reply(self, turn: dict[str, Any], state: SabreAgentState) -> AssistantMessage:
        status = turn.get("status")
        usage = turn.get("usage") or {}
        raw = {"sabre": {"conversation_id": turn.get("conversation_id"), "turn_id": turn.get("turn_id")}}
        tokens = {
            "prompt_tokens": usage.get("input_tokens", 0),
            "completion_tokens": usage.get("output_tokens", 0),
        }
        if status == "awaiting_tool_results":
            calls = [
                ToolCall(
                    id=c["id"], name=c["name"], arguments=c.get("arguments") or {}, requestor="assistant"
                )
                for c in turn.get("pending_tool_calls") or []
            ]
            if not calls:
                raise AgentError("SABRE paused without pending tool calls")
            state.pauses += 1
            state.tool_calls += len(calls)
            return AssistantMessage(role="assistant", tool_calls=calls, usage=tokens, raw_data=raw)
        if status == "completed":
            return AssistantMessage(
                role="assistant", content=turn.get("output") or "", usage=tokens, raw_data=raw
            )
        error = turn.get("error") or {}
        raise AgentError(
            f"SABRE turn {status}: {error.get('code', '?')}: {error.get('message', 'no message')} "
            f"(conversation {turn.get('conversation_id')})"
        )


def tool_result(message: ToolMessage) -> dict[str, Any]:
    """A tau2 tool message as a SABRE result: its JSON decoded (the model's code gets data, not a
    string of JSON), or its text; a failed call as ``error``, raised as ToolError in the code."""
    content = message.content or ""
    if message.error:
        return {"tool_call_id": message.id, "error": content[:20_000] or "the tool failed"}
    try:
        output: Any = json.loads(content)
    except ValueError:
        output = content
    return {"tool_call_id": message.id, "output": output}


def seed_history(messages: list[Message]) -> list[dict[str, Any]]:
    """tau2 messages as the ``messages`` of ``POST /v1/conversations``; empty when there is only
    tau2's opening greeting (a fresh simulation), which the model has no use for."""
    converted: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, UserMessage) and message.content:
            converted.append({"role": "user", "content": message.content})
        elif isinstance(message, AssistantMessage):
            entry: dict[str, Any] = {"role": "assistant"}
            if message.content:
                entry["content"] = message.content
            if message.tool_calls:
                entry["tool_calls"] = [
                    {"id": call.id, "name": call.name, "arguments": call.arguments}
                    for call in message.tool_calls
                ]
            if len(entry) > 1:
                converted.append(entry)
        elif isinstance(message, ToolMessage):
            converted.append({"role": "tool", **tool_result(message)})
    if all(m["role"] == "assistant" and "tool_calls" not in m for m in converted):
        return []
    return converted


def transcript(history: list[dict[str, Any]]) -> str:
    """The history as plain text, for a server that cannot take it as messages."""
    lines = ["The conversation so far:"]
    for m in history:
        if m["role"] == "tool":
            lines.append(f"[tool result {m['tool_call_id']}] {json.dumps(m.get('output', m.get('error')))}")
        elif "tool_calls" in m:
            calls = ", ".join(f"{c['name']}({json.dumps(c['arguments'])})" for c in m["tool_calls"])
            lines.append(f"[you called] {calls}")
        else:
            lines.append(f"[{'you' if m['role'] == 'assistant' else 'user'}] {m.get('content') or ''}")
    return "\n".join(lines)


def create_sabre_agent(tools: list[Tool], domain_policy: str, **kwargs: Any) -> SabreAgent:
    """tau2's agent factory: ``--agent-llm PERSONA[:MODEL]``, ``--agent-llm-args`` for the rest."""
    args: dict[str, Any] = dict(kwargs.get("llm_args") or {})
    llm = kwargs.get("llm") or AGENT_NAME
    persona, _, model = str(llm).partition(":")
    if persona in (AGENT_NAME, ""):
        persona = "default"
    return SabreAgent(
        tools=tools,
        domain_policy=domain_policy,
        base_url=str(args.get("base_url") or os.environ.get("SABRE_URL", "http://127.0.0.1:8011")),
        api_key=args.get("api_key") or os.environ.get("SABRE_API_KEY"),
        persona=str(args.get("persona") or persona),
        model=args.get("model") or model or None,
        max_iterations=args.get("max_iterations"),
        timeout=float(args.get("timeout", 600.0)),
        seed_history=bool(args.get("seed_history", True)),
        retries=int(args.get("retries", len(RETRY_DELAYS))),
    )


def register() -> None:
    """Add the ``sabre`` agent to tau2's registry (once)."""
    from tau2.registry import registry

    if AGENT_NAME not in registry.get_agents():
        registry.register_agent_factory(create_sabre_agent, AGENT_NAME)


def _code(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("code", "")) if isinstance(body, dict) else ""


def _problem(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict):
        return f"{body.get('code', '')} {body.get('detail') or body.get('title') or ''}".strip()[:500]
    return str(body)[:300]
