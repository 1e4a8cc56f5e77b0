"""``sabre chat``: a terminal client over the public API, built on the Python SDK (clients/python)."""

from app.chat_cli.session import ChatOptions, run_chat

__all__ = ["ChatOptions", "run_chat"]
