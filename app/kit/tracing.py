"""OpenTelemetry traces: exported over OTLP/HTTP when an endpoint is configured, off otherwise.

Off (the default) costs a module-global test per span: :func:`span` then hands back one shared
no-op context, no SDK object is made and no SQLAlchemy hook is installed. On, a process exports
spans for each request (``http …``), turn, iteration, model call, block, helper call and store
statement, batched in a background thread. The endpoint is ``SABRE_TRACING_ENDPOINT`` or the
standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the other
``OTEL_*`` variables apply: ``OTEL_SERVICE_NAME``, ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_BSP_SCHEDULE_DELAY``…); ``OTEL_SDK_DISABLED=true`` turns it off.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import structlog
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from sqlalchemy.ext.asyncio import AsyncEngine

    from app.config import Settings

log = structlog.get_logger(__name__)
T = TypeVar("T")

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
# One reusable no-op context: what every span is while tracing is off.
_OFF: AbstractContextManager[Span] = contextlib.nullcontext(trace.INVALID_SPAN)
_STATEMENT_CHARS = 500


def enabled() -> bool:
    """Whether this process exports traces."""
    return _tracer is not None


def configured_endpoint(settings: Settings) -> str | None:
    """Where traces go (None: tracing is off): the setting, else the standard OTEL_* variables."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    return (
        settings.tracing_endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or None
    )


def start_tracing(settings: Settings) -> bool:
    """Start exporting this process's spans if an endpoint is configured; whether it is on."""
    global _tracer, _provider
    if _tracer is not None:
        return True
    if configured_endpoint(settings) is None:
        return False
    # Imported only when on: the SDK and the exporter are not loaded by a process that never traces.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes: dict[str, str] = {}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "sabre"
    provider = TracerProvider(resource=Resource.create(attributes))
    # An explicit setting wins; else the exporter reads the OTEL_EXPORTER_OTLP_* variables itself.
    exporter = OTLPSpanExporter(endpoint=settings.tracing_endpoint or None)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _provider = provider
    _tracer = provider.get_tracer("sabre")
    log.info("tracing_started", endpoint=_without_credentials(configured_endpoint(settings) or ""))
    return True


def _without_credentials(url: str) -> str:
    """``url`` without its user, password, query and fragment (a collector's token may be in any of
    them): what a log line may say of where spans go."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}" if parts.scheme else "(an endpoint that is not a URL)"


def stop_tracing() -> None:
    """Export what is left and stop (the process is shutting down)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def span(name: str, attributes: Mapping[str, AttributeValue] | None = None) -> AbstractContextManager[Span]:
    """A span around the block, child of the current one; a shared no-op while tracing is off."""
    if _tracer is None:
        return _OFF
    return _tracer.start_as_current_span(name, attributes=attributes)


def server_span(name: str, *, headers: Mapping[str, str]) -> AbstractContextManager[Span]:
    """The root span of a request, continuing the caller's trace (W3C ``traceparent``)."""
    if _tracer is None:
        return _OFF
    return _tracer.start_as_current_span(name, context=propagate.extract(headers), kind=SpanKind.SERVER)


def carrier() -> dict[str, str]:
    """The current trace context as headers (``traceparent``…) for a job to continue; empty when off."""
    if _tracer is None:
        return {}
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


@contextlib.contextmanager
def continued(headers: Mapping[str, str] | None) -> Iterator[None]:
    """Run the block inside the trace ``headers`` carry (a job started by a traced request)."""
    if _tracer is None or not headers:
        yield
        return
    token = otel_context.attach(propagate.extract(headers))
    try:
        yield
    finally:
        otel_context.detach(token)


def instrument_engine(engine: AsyncEngine) -> None:
    """A span per SQL statement of ``engine`` (only installed while tracing is on)."""
    if _tracer is None:
        return
    from sqlalchemy import event

    tracer = _tracer
    system = engine.dialect.name

    def before(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        operation = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "SQL"
        context._sabre_span = tracer.start_span(
            f"store {operation}",
            kind=SpanKind.CLIENT,
            attributes={
                "db.system": system,
                "db.operation": operation,
                "db.statement": statement[:_STATEMENT_CHARS],  # parameters are bound, never inlined
            },
        )

    def after(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        current = getattr(context, "_sabre_span", None)
        if current is not None:
            current.end()

    def failed(exception_context: Any) -> None:
        current = getattr(exception_context.execution_context, "_sabre_span", None)
        if current is not None:
            current.set_status(Status(StatusCode.ERROR, type(exception_context.original_exception).__name__))
            current.end()

    event.listen(engine.sync_engine, "before_cursor_execute", before)
    event.listen(engine.sync_engine, "after_cursor_execute", after)
    event.listen(engine.sync_engine, "handle_error", failed)


class SpanSequence:
    """Consecutive spans of one name, each the current span until the next starts or
    :meth:`close` (a loop's iterations); nothing at all while tracing is off."""

    __slots__ = ("_name", "_span", "_token")

    def __init__(self, name: str) -> None:
        self._name = name
        self._span: Span | None = None
        self._token: object | None = None

    def next(self, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        """End the current span of the sequence and start the next."""
        if _tracer is None:
            return
        self.close()
        self._span = _tracer.start_span(self._name, attributes=attributes)
        self._token = otel_context.attach(trace.set_span_in_context(self._span))

    def close(self) -> None:
        """End the current span (in the task and context that started it)."""
        if self._span is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._span.end()
            self._span = self._token = None


async def traced(name: str, attributes: Mapping[str, AttributeValue] | None, work: Awaitable[T]) -> T:
    """Await ``work`` inside a span (a coroutine wrapper, so a task made of it carries the span)."""
    if _tracer is None:
        return await work
    with _tracer.start_as_current_span(name, attributes=attributes):
        return await work
