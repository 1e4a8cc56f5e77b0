"""What the model and the server send reaches the terminal as text, never as commands to it: escape
sequences (OSC 52 clipboard writes, OSC 8 links, titles, screen clears), C1 controls and bidi
overrides are shown escaped, rich markup in it stays text (a stray ``[/x]`` used to end the chat with a
``MarkupError``), and a figure's id cannot name a file outside the figures directory."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from sabre_api.models.event_out import EventOut
from sabre_api.models.message_out import MessageOut
from sabre_client import ConflictError, UnprocessableError

from app.chat_cli.render import TurnView, show_pending
from app.chat_cli.session import Chat, ChatOptions

CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"
HOSTILE = (
    f"before {CLIPBOARD} \x1b]8;;https://evil.example\x1b\\docs\x1b]8;;\x1b\\ \x1b[2J\x1b[1A"
    "\x1b]0;title\x1b\\ \x9b31m \u202eexe.txt [/] [link=https://evil.example]x[/link] [/oops] after"
)
SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own colours, the only escapes it may write


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, color_system="truecolor", width=200), out


def _assert_inert(written: str) -> None:
    """Nothing but rich's colours: no other escape, C1 control or bidi override reached the terminal."""
    rest = SGR.sub("", written)
    assert "\x1b" not in rest, rest
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", rest), rest
    assert "\\x1b]52;c;" in rest  # shown, so the user sees what the model tried


def _event(kind: str, data: dict[str, Any], *, seq: int = 1) -> EventOut:
    return EventOut.from_dict(
        {
            "created_at": "2025-01-01T00:00:00Z",
            "data": data,
            "id": f"evt_{seq}",
            "parent_id": None,
            "seq": seq,
            "turn_id": "turn_1",
            "type": kind,
        }
    )


def _no_fetch(file_id: str) -> bytes:
    raise AssertionError(f"fetched {file_id}")


def test_a_turns_events_cannot_drive_the_terminal(tmp_path: Path) -> None:
    console, out = _console()
    view = TurnView(console, figures=tmp_path / "figures", fetch_file=_no_fetch)
    events = [
        ("llm.delta", {"text": HOSTILE + "\n<helpers>\n"}),
        ("block.started", {"code": f"print('{HOSTILE}')"}),
        ("helper.started", {"name": HOSTILE}),
        ("block.completed", {"status": HOSTILE, "text": HOSTILE}),
        ("llm.delta", {"text": "</helpers>" + HOSTILE}),
        ("turn.failed", {"error": {"code": HOSTILE, "message": HOSTILE}}),
    ]
    for seq, (kind, data) in enumerate(events, start=1):
        view.show(_event(kind, data, seq=seq))
    written = out.getvalue()
    _assert_inert(written)
    assert "[/oops]" in written
    assert "[link=https://evil.example]" in written


def test_pending_calls_are_shown_inert() -> None:
    console, out = _console()
    show_pending(console, [{"id": f"call_1 {HOSTILE}", "name": HOSTILE, "arguments": {"q": HOSTILE}}])
    _assert_inert(out.getvalue())


def test_a_figure_id_cannot_leave_the_figures_directory(tmp_path: Path) -> None:
    console, out = _console()
    figures = tmp_path / "a" / "figures"
    view = TurnView(console, figures=figures, fetch_file=lambda file_id: b"\x89PNG")
    for file_id in ("../../escaped", str(tmp_path / "absolute"), "..", "file_1/../../x"):
        view.figure(file_id)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == []
    view.figure("file_0190aa0000abcdef0123456789")
    assert [p.name for p in figures.iterdir()] == ["file_0190aa0000abcdef0123456789.png"]
    assert "not an id" in out.getvalue()


@pytest.mark.parametrize("status", [409, 422, 418])
def test_an_error_answer_is_explained_inert(status: int, tmp_path: Path) -> None:
    console, out = _console()
    chat = Chat(ChatOptions(url="http://127.0.0.1:9", api_key=None, figures=tmp_path), console=console)
    error = (ConflictError if status == 409 else UnprocessableError)(
        status=status, body={"code": "odd", "detail": HOSTILE}, headers=httpx.Headers()
    )
    with chat.guard():
        raise error
    _assert_inert(out.getvalue())
    assert "[/oops]" in out.getvalue()


def test_the_history_is_shown_inert(tmp_path: Path) -> None:
    console, out = _console()
    chat = Chat(ChatOptions(url="http://127.0.0.1:9", api_key=None, figures=tmp_path), console=console)
    message = MessageOut.from_dict(
        {
            "id": "msg_1",
            "role": "assistant",
            "created_at": "2025-01-01T00:00:00Z",
            "seq": 1,
            "turn_id": "turn_1",
            "parts": [
                {"kind": "text", "text": HOSTILE},
                {"kind": "helpers", "code": HOSTILE, "closed": True},
                {"kind": "helpers_result", "status": "error", "text": HOSTILE, "files": [], "dropped": []},
                {
                    "kind": "tool_call",
                    "id": "call_1",
                    "name": HOSTILE,
                    "arguments": {"q": HOSTILE},
                    "code": None,
                },
                {"kind": "tool_result", "tool_call_id": "call_1", "error": HOSTILE, "output": None},
                {"kind": "tool_result", "tool_call_id": "call_1", "error": None, "output": {"q": HOSTILE}},
            ],
        }
    )
    for part in message.parts:
        chat._show_part(message.role, part)
    _assert_inert(out.getvalue())
