"""The ``sabre`` tau2 agent against a live SABRE (``SABRE_TEST_URL``) on .ci/tau2_model.py's model.

Run by .ci/tau2 with the tau2 venv's pytest; skipped without ``SABRE_TEST_URL``. Each test plays
tau2's orchestrator by hand: the messages tau2 would send, the messages it would get back.
"""

from __future__ import annotations

import json
import os

import pytest
from sabre_tau2.agent import SabreAgent, create_sabre_agent, register, seed_history, tool_result
from tau2.agent.base_agent import AgentError
from tau2.data_model.message import AssistantMessage, MultiToolMessage, ToolCall, ToolMessage, UserMessage
from tau2.domains.mock.environment import get_environment

URL = os.environ.get("SABRE_TEST_URL", "")
live = pytest.mark.skipif(not URL, reason="SABRE_TEST_URL not set (.ci/tau2 sets it)")
GREETING = AssistantMessage(role="assistant", content="Hi! How can I help you today?")


def agent(model: str = "sabre:scripted-parallel", **args: object) -> SabreAgent:
    env = get_environment()
    return create_sabre_agent(
        env.get_tools(), env.get_policy(), llm=model, llm_args={"base_url": URL, **args}
    )


def answer(calls: list[ToolCall], outputs: dict[str, object]) -> MultiToolMessage | ToolMessage:
    messages = [
        ToolMessage(id=c.id, role="tool", requestor="assistant", content=json.dumps(outputs[c.name]))
        for c in calls
    ]
    return messages[0] if len(messages) == 1 else MultiToolMessage(role="tool", tool_messages=messages)


@live
def test_parallel_calls_are_one_multi_tool_message_and_one_post() -> None:
    sabre = agent()
    state = sabre.get_init_state([GREETING])
    assert state.history == []  # tau2's greeting alone seeds nothing
    reply, state = sabre.generate_next_message(
        UserMessage(role="user", content="Please mark task_1 done. (ref: update_task_1)"), state
    )
    assert [c.name for c in reply.tool_calls or []] == ["get_users", "update_task_status"]
    assert reply.tool_calls[1].arguments == {"task_id": "task_1", "status": "completed"}
    assert reply.content is None
    outputs = {"get_users": [{"user_id": "user_1"}], "update_task_status": {"task_id": "task_1"}}
    final, state = sabre.generate_next_message(answer(reply.tool_calls, outputs), state)
    assert final.tool_calls is None
    assert final.content.startswith("Done (update_task_status)")
    assert (state.round_trips, state.pauses, state.tool_calls) == (2, 1, 2)
    sabre.stop(None, state)


@live
def test_one_call_at_a_time_and_a_tool_error() -> None:
    sabre = agent("sabre:scripted-sequential")
    state = sabre.get_init_state([GREETING])
    first, state = sabre.generate_next_message(
        UserMessage(role="user", content="Mark it done. (ref: update_task_1)"), state
    )
    assert [c.name for c in first.tool_calls or []] == ["get_users"]
    second, state = sabre.generate_next_message(answer(first.tool_calls, {"get_users": []}), state)
    [call] = second.tool_calls or []
    failed = ToolMessage(id=call.id, role="tool", requestor="assistant", content="Task not found", error=True)
    # The ToolError ends the block; the model (scripted) still closes the turn with its answer.
    final, state = sabre.generate_next_message(failed, state)
    assert final.content
    assert (state.round_trips, state.pauses) == (3, 2)


@live
def test_a_history_seeds_the_conversation() -> None:
    call = ToolCall(id="call_1", name="create_task", arguments={"user_id": "user_1", "title": "Review"})
    history = [
        GREETING,
        UserMessage(role="user", content="Create a task 'Review'."),
        AssistantMessage(role="assistant", tool_calls=[call]),
        ToolMessage(id="call_1", role="tool", requestor="assistant", content='{"task_id": "task_2"}'),
        AssistantMessage(role="assistant", content="Created task_2."),
    ]
    sabre = agent()
    state = sabre.get_init_state(history)
    assert state.history[2] == {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "name": "create_task", "arguments": {"user_id": "user_1", "title": "Review"}}
        ],
    }
    assert state.history[3] == {"role": "tool", "tool_call_id": "call_1", "output": {"task_id": "task_2"}}
    reply, state = sabre.generate_next_message(
        UserMessage(role="user", content="Now mark it done. (ref: update_task_with_message_history)"), state
    )
    assert [c.arguments.get("task_id") for c in reply.tool_calls or []] == [None, "task_2"]


@live
def test_refusals_are_readable_agent_errors() -> None:
    sabre = agent("no-such-persona")
    with pytest.raises(AgentError, match="422: unknown_persona"):
        sabre.generate_next_message(UserMessage(role="user", content="hi"), sabre.get_init_state([GREETING]))
    sabre = agent()
    state = sabre.get_init_state([GREETING])
    reply, state = sabre.generate_next_message(
        UserMessage(role="user", content="(ref: update_task_1)"), state
    )
    forged = [
        ToolCall(id=f"call_forged{i}", name=c.name, arguments=c.arguments)
        for i, c in enumerate(reply.tool_calls or [])
    ]
    with pytest.raises(AgentError, match="422: tool_call_ids_mismatch"):
        sabre.generate_next_message(answer(forged, {"get_users": [], "update_task_status": {}}), state)
    with pytest.raises(AgentError, match="tool results before any conversation"):
        sabre.generate_next_message(
            answer(forged, {"get_users": [], "update_task_status": {}}), sabre.get_init_state()
        )
    unreachable = agent(base_url="http://127.0.0.1:9", retries=1)
    unreachable_state = unreachable.get_init_state()
    with pytest.raises(AgentError, match="SABRE unreachable"):
        unreachable.generate_next_message(UserMessage(role="user", content="hi"), unreachable_state)


def test_tool_results_are_data_when_json_and_errors_when_failed() -> None:
    ok = ToolMessage(id="c1", role="tool", requestor="assistant", content='{"a": [1, 2]}')
    text = ToolMessage(id="c2", role="tool", requestor="assistant", content="plain words")
    failed = ToolMessage(id="c3", role="tool", requestor="assistant", content="boom", error=True)
    assert tool_result(ok) == {"tool_call_id": "c1", "output": {"a": [1, 2]}}
    assert tool_result(text) == {"tool_call_id": "c2", "output": "plain words"}
    assert tool_result(failed) == {"tool_call_id": "c3", "error": "boom"}


def test_model_string_and_registration() -> None:
    env = get_environment()
    made = create_sabre_agent(env.get_tools(), env.get_policy(), llm="tau2-retail:gpt-4.1", llm_args={})
    assert (made.persona, made.model) == ("tau2-retail", "gpt-4.1")
    made = create_sabre_agent(env.get_tools(), env.get_policy(), llm="sabre", llm_args=None)
    assert (made.persona, made.model) == ("default", None)
    assert seed_history([GREETING]) == []
    register()
    register()  # twice is harmless
    from tau2.registry import registry

    assert registry.get_agent_factory("sabre") is create_sabre_agent
