"""Prometheus metrics of this process (README, "Operations": where ``/metrics`` is served).

Labels are bounded: ``persona`` is a loaded persona's name, ``model`` a model the configuration
names (the default, a persona's) or ``other`` (a request may name any model: its string is never a
label), ``outcome`` a turn or block status, ``route`` a route template (``<unmatched>`` for the
rest). ``tenant`` appears only on the refusal counter: tenants are the operator's (API keys), and a
tenant is only counted there once it hits a limit; per-tenant usage is in the store, not in metrics.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)

TURNS = Counter("sabre_turns_total", "Turns run, by how they ended.", ["persona", "model", "outcome"])
TURN_SECONDS = Histogram(
    "sabre_turn_seconds",
    "Wall time of a turn (request in to state persisted), LLM time included.",
    ["persona", "model", "outcome"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
BLOCKS = Counter("sabre_blocks_total", "Sandbox blocks run, by outcome.", ["outcome"])
BLOCK_PROCESSES = Counter(
    "sabre_block_processes_total",
    "Sandbox blocks by the process they ran in: fresh (a new fork replaying the journal), live (the "
    "process the conversation's last block left), prepared (a new fork readied while the model wrote "
    "the block), resumed (its paused block, continued in place).",
    ["process"],
)
BLOCK_FAILURES = Counter(
    "sabre_block_failures_total",
    "Sandbox blocks the runtime ended because they did not report their own end, by why: limit, "
    "protocol_violation (the block broke the sandbox protocol: hostile or a runtime bug), killed, "
    "exited_early, worker_lost.",
    ["failure"],
)
BLOCK_SECONDS = Histogram(
    "sabre_block_seconds",
    "Time a block spent in the sandbox.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30),
)
LLM_TOKENS = Counter(
    "sabre_llm_tokens_total", "Tokens billed by the model.", ["persona", "model", "direction"]
)
HTTP_REQUESTS = Counter("sabre_http_requests_total", "HTTP requests answered.", ["method", "route", "status"])
HTTP_SECONDS = Histogram(
    "sabre_http_request_seconds",
    "Time to the end of the response (a stream: to its last event).",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
)
LIMITED = Counter(
    "sabre_limited_total",
    "Requests refused by a tenant limit (rate, concurrent_turns, token_quota).",
    ["tenant", "limit"],
)

if TYPE_CHECKING:
    from app.config import Settings

OTHER_LABEL = "other"  # a persona or model outside the configuration
CONTENT_TYPE = CONTENT_TYPE_LATEST

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"


def exposition() -> bytes:
    """This process's metrics in the text format; every worker's when ``sabre serve --workers N``
    runs them in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set by ``sabre serve``)."""
    if os.environ.get(MULTIPROCESS_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest(REGISTRY)


def share_across_processes() -> None:
    """Before ``sabre serve`` starts several server processes: each writes its metrics to a shared
    directory (prometheus_client's multiprocess mode, inherited through the environment), so
    ``/metrics``, wherever it is served, shows their sum rather than one process's."""
    directory = tempfile.mkdtemp(prefix="sabre-metrics-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    os.environ[MULTIPROCESS_ENV] = directory


def start_metrics_server(settings: Settings) -> None:
    """Serve ``/metrics`` on ``SABRE_METRICS_PORT`` (at ``SABRE_METRICS_HOST``) from a thread of
    this process: every server process's metrics after :func:`share_across_processes`."""
    assert settings.metrics_port is not None
    registry: CollectorRegistry = REGISTRY
    if os.environ.get(MULTIPROCESS_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    start_http_server(settings.metrics_port, addr=settings.metrics_host, registry=registry)
