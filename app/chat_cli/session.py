"""``sabre chat``: a terminal conversation over the public API (through the Python SDK).

Each line is a message; the turn streams back (prose as it is written, code highlighted, results as
they come). A turn that waits for external calls shows them and asks for each result at the prompt.
Every failure (no server, a refused key, a conflict) is one sentence saying what happened and what to
do; the chat goes on.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from sabre_client import (
    ApiError,
    AuthenticationError,
    ConflictError,
    ConnectionFailed,
    NotFoundError,
    PreconditionFailedError,
    Sabre,
    SabreError,
    StreamInterrupted,
    TurnStream,
    UnprocessableError,
)

from app.chat_cli.render import TurnView, plain, printable, show_pending

COMMANDS: dict[str, str] = {
    "/persona NAME": "talk to another persona (a new conversation); /persona alone lists them",
    "/new": "start a new conversation with the same persona",
    "/history": "show this conversation so far",
    "/answer": "answer the external calls the conversation waits for",
    "/help": "this list",
    "/exit": "leave (Ctrl-D too); Ctrl-C stops a running turn",
}


@dataclass
class ChatOptions:
    """What ``sabre chat`` was started with."""

    url: str
    api_key: str | None
    persona: str = "default"
    tools: list[dict[str, Any]] = field(default_factory=list)
    figures: Path = Path("sabre-figures")


class Chat:
    """One terminal session: the current persona and conversation, the prompt, the renderer."""

    def __init__(self, options: ChatOptions, *, console: Console | None = None) -> None:
        self.options = options
        self.console = console or Console(highlight=False)
        self.sabre = Sabre(options.url, api_key=options.api_key or None)
        self.persona = options.persona
        self.conversation_id: str | None = None
        self.version: int | None = None
        self._prompt: Callable[[str], str] = _plain_prompt

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        """Greet, check the server, then read lines until /exit or end of input."""
        where = f"{self.options.url} · persona [bold]{self.persona}[/bold]"
        self.console.print(f"[bold]SABRE chat[/bold] · {where} · /help for commands")
        with self.guard():
            names = [p.name for p in self.sabre.personas()]
            if self.persona not in names:
                self.console.print(f"[yellow]No persona {self.persona!r} here; using default.[/yellow]")
                self.persona = "default"
        self._prompt = _interactive_prompt() if sys.stdin.isatty() else _plain_prompt
        while True:
            try:
                line = self._prompt(f"{self.persona}> ").strip()
            except KeyboardInterrupt:
                continue
            except EOFError:
                break
            if not line:
                continue
            if line in ("/exit", "/quit"):
                break
            self.handle(line)
        self.sabre.close()
        return 0

    def handle(self, line: str) -> None:
        """A slash command, or a message to send."""
        command, _, argument = line.partition(" ")
        if command == "/help":
            table = Table(show_header=False, box=None)
            for name, what in COMMANDS.items():
                table.add_row(f"[bold]{name}[/bold]", what)
            self.console.print(table)
        elif command == "/new":
            self.conversation_id = self.version = None
            self.console.print("[dim]New conversation: your next message starts it.[/dim]")
        elif command == "/persona":
            self.choose_persona(argument.strip())
        elif command == "/history":
            self.history()
        elif command == "/answer":
            self.answer_pending()
        elif command.startswith("/"):
            self.console.print(f"[yellow]Unknown command {command}.[/yellow] /help lists them.")
        else:
            self.send(line)

    # -- commands -------------------------------------------------------------------------------

    def choose_persona(self, name: str) -> None:
        """Switch persona (a new conversation), or list the personas."""
        with self.guard():
            personas = {p.name: p for p in self.sabre.personas()}
            if not name:
                table = Table("persona", "description", box=None)
                for persona in personas.values():
                    description = persona.description.splitlines()[0] if persona.description else ""
                    table.add_row(Text(printable(persona.name)), Text(printable(description)))
                self.console.print(table)
                return
            if name not in personas:
                self.console.print(
                    f"[yellow]No persona {plain(repr(name))}.[/yellow] "
                    f"Available: {plain(', '.join(sorted(personas)))}."
                )
                return
            self.persona, self.conversation_id, self.version = name, None, None
            self.console.print(f"[dim]Persona {name}: your next message starts a new conversation.[/dim]")

    def history(self) -> None:
        """The conversation so far, as the transcript stores it."""
        if self.conversation_id is None:
            self.console.print("[dim]No conversation yet: send a message.[/dim]")
            return
        with self.guard():
            for message in self.sabre.messages(self.conversation_id):
                for part in message.parts:
                    self._show_part(message.role, part)

    def _show_part(self, role: str, part: Any) -> None:
        kind = part.kind
        if kind == "text":
            style = "bold cyan" if role == "user" else ""
            prefix = "you: " if role == "user" else ""
            self.console.print(Text(printable(prefix + part.text), style=style))
        elif kind == "helpers":
            code = Syntax(printable(part.code), "python", theme="ansi_dark")
            self.console.print(Panel(code, title="helpers"))
        elif kind == "helpers_result":
            text = Text(printable(part.text or "(no output)"))
            self.console.print(Panel(text, title=f"result: {plain(part.status)}"))
        elif kind == "tool_call":
            arguments = json.dumps(part.arguments.to_dict(), ensure_ascii=False)
            self.console.print(Text(printable(f"external call {part.name}({arguments})"), style="yellow"))
        elif kind == "tool_result":
            shown = f"error: {part.error}" if part.error else json.dumps(part.output, ensure_ascii=False)
            self.console.print(Text(printable(f"  ← {shown}"), style="yellow"))

    def answer_pending(self) -> None:
        """Ask again for the results of the calls the conversation waits for."""
        if self.conversation_id is None:
            self.console.print("[dim]No conversation yet: send a message.[/dim]")
            return
        with self.guard():
            state = self.sabre.get_conversation(self.conversation_id)
            calls = [call.to_dict() for call in state.pending_tool_calls]
            if not calls:
                self.console.print("[dim]Nothing is pending.[/dim]")
                return
            show_pending(self.console, calls)
            results = self.ask_results(calls)
            if results is not None:
                self.follow(self.sabre.stream_tool_results(self.conversation_id, results))

    # -- turns ----------------------------------------------------------------------------------

    def send(self, text: str) -> None:
        """Send a message (starting a conversation if needed) and show the turn."""
        with self.guard():
            if self.conversation_id is None:
                stream = self.sabre.stream_conversation(text, persona=self.persona, tools=self.options.tools)
            else:
                stream = self.sabre.stream_message(self.conversation_id, text)
            self.follow(stream)

    def follow(self, stream: TurnStream) -> None:
        """Show a turn's events; answer its external calls at the prompt if it pauses."""
        view = TurnView(self.console, figures=self.options.figures, fetch_file=self.sabre.file)
        try:
            for event in stream:
                if self.conversation_id is None and stream.state.conversation_id is not None:
                    self.conversation_id = stream.state.conversation_id
                    self.console.print(Text(f"conversation {printable(self.conversation_id)}", style="dim"))
                view.show(event)
        except KeyboardInterrupt:
            self.cancel(stream)
            return
        turn = stream.turn
        if turn is None:
            return
        self.conversation_id, self.version = turn.conversation_id, turn.version
        if turn.status == "awaiting_tool_results":
            calls = [call.to_dict() for call in turn.pending_tool_calls]
            show_pending(self.console, calls)
            results = self.ask_results(calls)
            if results is None:
                self.console.print("[dim]Left unanswered: /answer to answer them, or /new.[/dim]")
                return
            self.follow(self.sabre.stream_tool_results(turn.conversation_id, results))

    def ask_results(self, calls: list[dict[str, Any]]) -> list[Any] | None:
        """Each pending call's result, read at the prompt: JSON (or plain text), ``!message`` for an
        error; None if the user gives up (Ctrl-C)."""
        from sabre_api.models.tool_error import ToolError
        from sabre_api.models.tool_output import ToolOutput

        self.console.print(
            "[dim]Answer each call: JSON or text is its result, !message raises an error.[/dim]"
        )
        answers: list[Any] = []
        for call in calls:
            try:
                raw = self._prompt(f"{printable(call.get('name'))} result> ").strip()
            except (KeyboardInterrupt, EOFError):
                return None
            if raw.startswith("!"):
                answers.append(ToolError(tool_call_id=str(call["id"]), error=raw[1:].strip() or "failed"))
                continue
            try:
                value: Any = json.loads(raw)
            except ValueError:
                value = raw
            answers.append(ToolOutput(tool_call_id=str(call["id"]), output=value))
        return answers

    def cancel(self, stream: TurnStream) -> None:
        """Ctrl-C during a turn: stop it on the server."""
        self.console.print()
        if stream.state.conversation_id and stream.state.turn_id:
            with self.guard():
                self.sabre.cancel_turn(stream.state.conversation_id, stream.state.turn_id, wait=5)
                self.console.print("[yellow]Turn cancelled.[/yellow]")

    # -- errors ---------------------------------------------------------------------------------

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Say what went wrong and how to go on, instead of a traceback; the chat continues."""
        try:
            yield
        except SabreError as exc:
            self.console.print(Text(printable(self.explain(exc)), style="red"))

    def explain(self, exc: SabreError) -> str:
        """One or two sentences: what happened, what to do."""
        url = self.options.url
        if isinstance(exc, StreamInterrupted):
            return (
                "The connection to the server broke and could not be resumed; the turn may still be running: "
                "/history shows what it did."
            )
        if isinstance(exc, ConnectionFailed):
            return (
                f"Cannot reach SABRE at {url}. Start it with `uv run sabre serve` (or pass --url), "
                "then send your message again."
            )
        if not isinstance(exc, ApiError):
            return str(exc)
        if isinstance(exc, AuthenticationError):
            return (
                "The server refused the API key (401). Set SABRE_API_KEY or --api-key to a key it knows "
                "(`sabre keys create --tenant NAME` makes one)."
            )
        if isinstance(exc, ConflictError):
            advice = {
                "turn_in_progress": "A turn is already running on this conversation: wait for it, or /new.",
                "awaiting_tool_results": "The conversation waits for tool results: /answer to answer them, "
                "or /new.",
                "no_pending_tool_calls": "No tool calls are pending any more (answered elsewhere?): send a "
                "message to go on, or /history.",
            }
            return advice.get(
                exc.code, f"Conflict ({exc.code}): {exc.detail} /history shows where it stands."
            )
        if isinstance(exc, PreconditionFailedError):
            return f"The conversation changed elsewhere ({exc.detail}) /history shows it; then go on."
        if isinstance(exc, NotFoundError) and self.conversation_id is not None:
            self.conversation_id = None
            return "This conversation no longer exists; your next message starts a new one."
        if isinstance(exc, UnprocessableError):
            return f"The server did not accept that ({exc.code}): {exc.detail}"
        if exc.status_code >= 500:
            return f"The server could not do it ({exc.status_code} {exc.code}); try again in a moment."
        return f"{exc.status_code} {exc.code}: {exc.detail}"


def _plain_prompt(message: str) -> str:
    sys.stdout.write(printable(message))
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line


def _interactive_prompt() -> Callable[[str], str]:
    """A prompt_toolkit prompt with line editing and history (loaded only for a terminal)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import InMemoryHistory

    session: PromptSession[str] = PromptSession(history=InMemoryHistory())

    def ask(message: str) -> str:
        return session.prompt(message)

    return ask


def run_chat(options: ChatOptions) -> int:
    """Run a chat session; its exit code."""
    return Chat(options).run()
