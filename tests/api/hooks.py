"""schemathesis hooks (tests/api/schemathesis.toml), applied before every call of every phase.

- Every Idempotency-Key is new: a key reused with another body is rightly a 422
  (``idempotency_key_reused``), and generated keys repeat across bodies. Replays have their own
  tests (tests/conversations/test_idempotency_lease.py).
- In schema-valid chat completions, system and developer messages come first (an order rule of the
  Chat Completions face, not a schema one).
- In schema-valid cases, names that must exist or be free name what exists or is free: a persona
  (the names are configuration: an unknown one is a 422 ``unknown_persona``) and tools (a keyword,
  a helper's name or an unusable JSON Schema is a 422 ``invalid_tool``, checked by
  tests/conversations/test_bad_input.py). Schema-violating cases are left alone: they stay negative.
- A seeded history (``messages`` of a create) keeps its user messages only: that a ``tool`` message
  answers a call of the assistant message right before it is order, which a schema cannot say
  (422 ``invalid_history``, checked by tests/conversations/test_history.py); ``input`` is given
  when no message is left for the model to answer.
- A chat completion's positive case names the ``sabre/default`` model (models are personas:
  another name is a 404) and keeps the order the service needs, which a schema cannot say either
  (422 ``invalid_chat_request``, checked by tests/openai_compat/test_chat_completions.py): its
  system and developer messages first, then its user messages, then a user message to answer.
"""

from __future__ import annotations

import uuid
from typing import Any

import schemathesis
from schemathesis import GenerationMode

from app.openai_compat.schemas import MAX_CHAT_MESSAGES


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """Fresh idempotency keys; existing personas and free tool names (see the module docstring)."""
    headers = case.headers
    if headers and isinstance(headers.get("Idempotency-Key"), str):
        headers["Idempotency-Key"] = f"{headers['Idempotency-Key'][:200]}-{uuid.uuid4().hex}"
    body = case.body
    if (
        case.meta is None
        or case.meta.generation.mode != GenerationMode.POSITIVE
        or not isinstance(body, dict)
    ):
        return
    if isinstance(body.get("persona"), str):
        body["persona"] = "default"
    if case.method.upper() == "POST" and case.path == "/v1/conversations":
        if isinstance(body.get("messages"), list):
            messages = body["messages"]
            body["messages"] = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if not body.get("messages") and not body.get("input"):
            body["input"] = "Hello."
    if case.method.upper() == "POST" and case.path == "/v1/chat/completions":
        body["model"] = "sabre/default"
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        leading = [m for m in messages if m.get("role") in ("system", "developer")]
        users = [m for m in messages if m.get("role") == "user"]
        kept = [*leading, *users][: MAX_CHAT_MESSAGES - 1]
        body["messages"] = [*kept, {"role": "user", "content": "Hello."}]
    for index, tool in enumerate(body.get("tools") or []):
        target = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(target, dict):
            target["name"] = f"external_tool_{index}"
            target["parameters"] = {"type": "object", "properties": {}}
