"""The scripted model of the tau2 CI run: it plays both tau2's user simulator and SABRE's model.

Serves ``app.llm.scripted`` on a port with a responder that reads the mock domain's tasks:
- a request of tau2's user simulator (its system prompt holds the task's ``<scenario>``) gets an
  opening naming the task, ``(ref: TASK_ID)``, then ``###STOP###`` once it has spoken; a scenario
  that tells the user to call ``check_notifications`` first and ``dismiss_notification`` at the end
  gets those as tool calls (``Reply.tool_calls``);
- a request of SABRE (its system prompt teaches ``<helpers>``) for the task the latest ``ref`` names
  gets a block that looks the users up and makes the task's expected calls (``get_users`` and the
  writes: one after another, or in one ``parallel`` batch when the model asked for has "parallel" in
  its name), then, once the block ran, a closing answer that states the task's ``communicate_info``.

    uv run python .ci/tau2_model.py --port 8999 --tasks DATA/tau2/domains/mock/tasks.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import threading
from pathlib import Path
from typing import Any

from app.llm.scripted import RecordedRequest, Reply, ScriptedLLM, ScriptedToolCall

REF = re.compile(r"\(ref: ([A-Za-z0-9_\-]+)\)")
NOTIFICATION = re.compile(r"notif_[A-Za-z0-9_]+")
STOP = "###STOP###"


def _calls(task: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The writes the task expects: its actions, or what its env assertions check for."""
    criteria = task.get("evaluation_criteria") or {}
    calls = [(a["name"], a.get("arguments") or {}) for a in criteria.get("actions") or []]
    if not calls:
        for assertion in criteria.get("env_assertions") or []:
            if assertion.get("env_type") == "assistant" and assertion["func_name"] == "assert_task_status":
                arguments = assertion["arguments"]
                calls.append(
                    (
                        "update_task_status",
                        {"task_id": arguments["task_id"], "status": arguments["expected_status"]},
                    )
                )
    return calls


def block(task: dict[str, Any], *, parallel: bool) -> str:
    """The agent's one block for a task."""
    calls = [("get_users", {}), *_calls(task)]
    if parallel:
        items = ", ".join(f"({name}, {json.dumps(args)})" for name, args in calls)
        names = ", ".join(f"r{i}" for i in range(len(calls)))
        code = f"{names}, = parallel([{items}])\n"
    else:
        code = "".join(
            f"r{i} = {name}({', '.join(f'{k}={v!r}' for k, v in args.items())})\n"
            for i, (name, args) in enumerate(calls)
        )
    code += "".join(f"print({f'r{i}'!r}, r{i})\n" for i in range(len(calls)))
    return f"<helpers>\n{code}</helpers>"


def closing(task: dict[str, Any]) -> str:
    """The agent's answer once the block ran: what it did, and what the task wants said."""
    criteria = task.get("evaluation_criteria") or {}
    names = [name for name, _ in _calls(task)]
    said = " ".join(f"{info}." for info in criteria.get("communicate_info") or [])
    if "transfer_to_human_agents" in names:
        return (
            f"I cannot do that with the tools I have, so I transferred you to a human agent. {said}".strip()
        )
    done = ", ".join(names) or "nothing needed changing"
    return f"Done ({done}). {said}".strip()


class Responder:
    """Answers both roles from the tasks file; counts what it served."""

    def __init__(self, tasks: list[dict[str, Any]]) -> None:
        self.tasks = {task["id"]: task for task in tasks}
        self.lock = threading.Lock()
        self.served: dict[str, int] = {"user": 0, "agent": 0}

    def __call__(self, request: RecordedRequest) -> str | Reply:
        if "<scenario>" in request.instructions:
            return self._user(request)
        return self._agent(request)

    def _user(self, request: RecordedRequest) -> str | Reply:
        with self.lock:
            self.served["user"] += 1
        scenario = request.instructions.split("<scenario>", 1)[1]
        tools_used = sum(1 for m in request.messages if m.role == "tool")
        # The simulator's own lines are the "assistant" messages of its requests.
        spoke = any(REF.search(m.text) for m in request.messages if m.role == "assistant")
        if "check_notifications" in scenario and tools_used == 0:
            return Reply(tool_calls=[ScriptedToolCall(name="check_notifications")])
        if spoke:
            found = NOTIFICATION.search(scenario)
            if "dismiss_notification" in scenario and found and tools_used < 2:
                call = ScriptedToolCall(
                    name="dismiss_notification", arguments={"notification_id": found.group()}
                )
                return Reply(tool_calls=[call])
            return f"Thank you, that is all. {STOP}"
        matches = [t for t in self.tasks.values() if _instructions(t) and _instructions(t) in scenario]
        if not matches:
            return f"I do not know what I want. {STOP}"
        task = max(matches, key=lambda t: len(_instructions(t)))
        return f"Hello, I need help with my tasks. (ref: {task['id']})"

    def _agent(self, request: RecordedRequest) -> str:
        with self.lock:
            self.served["agent"] += 1
        task_id = None
        for message in reversed(request.messages):
            found = REF.search(message.text) if message.role == "user" else None
            if found:
                task_id = found.group(1)
                break
        task = self.tasks.get(task_id or "")
        if task is None:
            return "How can I help you?"
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "user" and "<helpers_result>" in last.text:
            return closing(task)
        return block(task, parallel="parallel" in (request.model or ""))


def _instructions(task: dict[str, Any]) -> str:
    instructions = (task.get("user_scenario") or {}).get("instructions")
    return instructions if isinstance(instructions, str) else ""


def main() -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tasks", type=Path, required=True)
    args = parser.parse_args()
    responder = Responder(json.loads(args.tasks.read_text()))
    with ScriptedLLM(responder=responder, port=args.port, private_path=False) as server:
        print(f"tau2 scripted model at {server.base_url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
