"""``sabre chat`` in a real terminal (tmux: send-keys, capture-pane) against a live ``sabre serve``
with the demo scripted model: streamed text, highlighted code and results, an external call answered
at the prompt, a figure saved, slash commands, and no traceback for a server that is down, a refused
key or a 409. Prints the time from start to the first prompt. Skipped where tmux is missing."""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.llm.scripted import ScriptedLLM
from tests.live_server import ROOT, demo_responder, free_port, sabre_server

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

KEY = "sk-chat-test"
TOOLS = [
    {
        "type": "function",
        "name": "get_order",
        "description": "Look up an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    }
]


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with (
        ScriptedLLM(responder=demo_responder) as llm,
        sabre_server(
            data_dir=tmp_path_factory.mktemp("chat"), llm_url=llm.base_url, api_keys=f"chat:{KEY}"
        ) as url,
    ):
        yield url


class Terminal:
    """A tmux session running one command; keys in, screen text out."""

    def __init__(self, command: list[str], *, env: dict[str, str]) -> None:
        self.name = f"sabre-chat-{secrets.token_hex(4)}"
        # A tmux server of its own (-L), started with remain-on-exit already on: the pane stays
        # after the program exits, even one that exits at once, so its last screen can be read.
        config = Path(tempfile.mkdtemp(prefix="tmux-")) / "tmux.conf"
        config.write_text("set-option -g remain-on-exit on\n")
        self.tmux = ["tmux", "-L", self.name]
        environment = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
        size = ["-x", "110", "-y", "50"]
        start = [*self.tmux, "-f", str(config), "new-session", "-d", "-s", self.name, *size, "-c", str(ROOT)]
        subprocess.run([*start, *environment, shlex.join(command)], check=True)

    def screen(self) -> str:
        done = subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-J", "-t", self.name, "-S", "-2000"],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout

    def send(self, text: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, "-l", text], check=True)
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, "Enter"], check=True)

    def wait_for(self, needle: str, *, count: int = 1, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if screen.count(needle) >= count:
                return screen
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} did not appear; the screen:\n{self.screen()}")

    def exited(self, timeout: float = 15) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = subprocess.run(
                [*self.tmux, "display-message", "-p", "-t", self.name, "#{pane_dead}"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            if dead == "1":
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], check=False, capture_output=True)


def chat_command(url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", "chat", "--url", url, *extra]


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def test_a_chat_session_in_a_terminal(live_url: str, tmp_path: Path, terminals: list[Terminal]) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    figures = tmp_path / "figures"
    started = time.monotonic()
    term = Terminal(
        chat_command(live_url, "--tools", str(tools), "--figures", str(figures)),
        env={"SABRE_API_KEY": KEY, "TERM": "xterm-256color"},
    )
    terminals.append(term)
    term.wait_for("default>")
    print(f"\nsabre chat: first prompt after {time.monotonic() - started:.2f} s")

    term.send("code: add up")
    screen = term.wait_for("The block printed: 45")
    assert "print(sum(range(10)))" in screen  # the block, in its panel
    assert "result: ok" in screen
    assert "Computing." in screen  # the prose before the block, streamed

    term.send("tool: where is A1?")
    screen = term.wait_for("get_order result>")
    assert "external call: get_order" in screen
    assert '"order_id": "A1"' in screen
    term.send('{"status": "shipped"}')
    term.wait_for("The block printed: {'status': 'shipped'}")

    term.send("plot: a line")
    screen = term.wait_for("figure saved: ")
    assert len(list(figures.glob("file_*.png"))) == 1

    # A 409: the pending call is answered elsewhere while the chat asks for it.
    term.send("tool: and B2?")
    screen = term.wait_for("get_order result>", count=2)
    conversation = screen.split("conversation ", 1)[1].split()[0]
    headers = {"Authorization": f"Bearer {KEY}"}
    state = httpx.get(f"{live_url}/v1/conversations/{conversation}", headers=headers).json()
    call_id = state["pending_tool_calls"][0]["id"]
    answered = httpx.post(
        f"{live_url}/v1/conversations/{conversation}/tool-results",
        json={"results": [{"tool_call_id": call_id, "output": "elsewhere"}]},
        headers=headers,
        timeout=30,
    )
    assert answered.status_code == 200, answered.text
    term.send('"late"')
    term.wait_for("No tool calls are pending any more")

    term.send("/history")
    term.wait_for("you: code: add up")
    term.send("/persona coder")
    term.wait_for("coder>")
    term.send("/help")
    term.wait_for("/persona NAME")
    assert "Traceback" not in term.screen()
    term.send("/exit")
    assert term.exited()


@pytest.mark.parametrize("case", ["server down", "refused key"])
def test_failures_are_explained_without_a_traceback(
    live_url: str, case: str, terminals: list[Terminal]
) -> None:
    url = f"http://127.0.0.1:{free_port()}" if case == "server down" else live_url
    term = Terminal(chat_command(url), env={"SABRE_API_KEY": "sk-wrong", "TERM": "xterm-256color"})
    terminals.append(term)
    expected = "Cannot reach SABRE" if case == "server down" else "refused the API key"
    term.wait_for(expected)
    term.wait_for("default>")
    term.send("hello")
    screen = term.wait_for(expected, count=2)
    assert "Traceback" not in screen
    term.send("/exit")
    assert term.exited()
