"""structlog set up once per process: JSON lines in production, readable lines on a terminal.

Every process configures itself (``create_app`` runs in each ``sabre serve --workers N`` process,
``sabre worker`` calls it too): uvicorn starts its workers with ``spawn``, so a configuration made
only in the parent never reaches them, and they would log in structlog's default (console, stdout).
The standard library's loggers (uvicorn, procrastinate, SQLAlchemy) go through the same renderer, so
every line a process writes is one JSON object with the request id of the request it served.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]

_SHARED: list[structlog.types.Processor] = [
    structlog.contextvars.merge_contextvars,  # request_id, turn_id… bound for the request or the turn
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure_logging(*, level: str = "INFO", fmt: LogFormat = "auto") -> None:
    """Route structlog and the standard library through one renderer on stderr (idempotent)."""
    json_lines = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer()
    )
    numeric = logging.getLevelName(level)
    structlog.configure(
        processors=[*_SHARED, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # The standard library's records, rendered like ours (their logger name kept as "logger").
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_SHARED, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    handler.set_name("sabre")
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if h.get_name() != "sabre"] + [handler]
    root.setLevel(max(numeric, logging.WARNING))  # libraries: warnings and errors; ours: SABRE_LOG_LEVEL
    # uvicorn's own handlers would print a second, plain copy; its access log is replaced by ours.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = name != "uvicorn.access"


def ensure_logging(*, level: str = "INFO", fmt: LogFormat = "auto") -> None:
    """Configure logging unless this process already did (the CLI, before it starts the server; a
    test capturing logs): how every ``sabre serve --workers N`` process gets configured."""
    if not structlog.is_configured():
        configure_logging(level=level, fmt=fmt)
