"""Webhooks: the end of every turn POSTed to the conversation's URL (or its tenant's default),
signed the Standard Webhooks way and delivered by the job engine with retries.

One entry point for the turn code, :func:`schedule_turn_webhook`, called after a turn's final commit:
it resolves the URL and queues a ``deliver_webhook`` job on the ``webhooks`` queue. The job:
- sends ``{"type", "timestamp", "data": <the Turn>}`` with the headers ``webhook-id`` (the same for
  every attempt at one message, so a receiver can drop duplicates), ``webhook-timestamp`` and
  ``webhook-signature`` (``v1,`` + base64 HMAC-SHA256 of ``id.timestamp.body``);
- goes through the SSRF guard of the fetch helpers (``app.helpers.net``): the host is resolved,
  every address checked and the request sent to the checked address; private, loopback and
  link-local addresses are refused unless ``SABRE_WEBHOOK_ALLOW`` lists them. A refused URL is
  logged and the job fails without a retry (another attempt would be refused the same way);
- counts as delivered on a 2xx answer; anything else (a network error, a timeout, another status,
  a redirect, which is never followed) is retried with exponential backoff, at most
  ``MAX_RETRIES`` times;
- runs in the worker's webhook slots, in its tenant's share of them (``app.kit.jobs``), and a
  retry only when no first attempt waits: receivers that fail are tried after those that answer,
  and one tenant's dead receivers delay no one's first attempts.

Each tenant signs with a secret of its own, ``whsec_`` + base64 of HMAC-SHA256(server secret,
tenant): the server secret is ``SABRE_WEBHOOK_SECRET``, or one generated once and kept in the store.
``sabre webhooks secret TENANT`` prints a tenant's secret for its receiver to verify with.

A URL is checked for shape when a conversation names it (http or https, a host, a port 1-65535,
no credentials, at most 2,048 characters); its addresses are checked at each delivery, since DNS
answers change.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Literal, cast, get_args

import httpx
import procrastinate
import structlog
from procrastinate import JobContext, RetryDecision, RetryStrategy
from procrastinate.jobs import Job
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from standardwebhooks import Webhook

from app.helpers.net import FetchError, FetchLimits, NetworkDenied, NetworkPolicy, fetch
from app.kit.jobs import RETRY_PRIORITY, defer, job_resources
from app.kit.secrets import server_secret

if TYPE_CHECKING:
    from app.config import Settings
    from app.wiring import Resources

log = structlog.get_logger(__name__)

WebhookEventType = Literal["turn.completed", "turn.awaiting_tool_results", "turn.failed", "turn.cancelled"]

URL_MAX_CHARS: Final = 2048
TASK: Final = "deliver_webhook"
USER_AGENT: Final = "SABRE-Webhooks/1"
# Retries after the first attempt, waiting 2, 4, 8, … 1,024 s: about 34 minutes in all.
MAX_RETRIES: Final = 10
# A receiver's answer is read (and dropped) up to this size; a larger one counts as a failure.
_MAX_RESPONSE_BYTES: Final = 1_000_000
_SECRET_NAME: Final = "webhooks"
_EVENTS: Final = frozenset(get_args(WebhookEventType))
# A host name as httpx encodes it (IDNA applied): DNS labels (IP addresses are checked apart).
_HOST_NAME: Final = re.compile(
    r"(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\.)*[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\.?", re.IGNORECASE
)

blueprint = procrastinate.Blueprint()


class WebhookDeliveryError(Exception):
    """One attempt failed in a way a later attempt may not: retried with backoff."""


class WebhookRefused(Exception):
    """The SSRF guard refused the URL: never retried."""


def webhook_event(status: str) -> WebhookEventType:
    """The webhook event that ends a turn of this status (completed, awaiting_tool_results, failed,
    cancelled)."""
    event = f"turn.{status}"
    if event not in _EVENTS:
        raise ValueError(f"no webhook event ends a turn with status {status!r}")
    return cast(WebhookEventType, event)


def check_webhook_url(value: str) -> str:
    """``value`` if it is a URL a webhook may name (http or https, a host, a port 1-65535 if any, no
    user or password, at most ``URL_MAX_CHARS`` characters), else ValueError saying what is wrong."""
    if len(value) > URL_MAX_CHARS:
        raise ValueError(f"must be at most {URL_MAX_CHARS} characters")
    try:
        url = httpx.URL(value)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ValueError(f"is not a valid URL: {exc}") from None
    if url.scheme not in ("http", "https"):
        raise ValueError("must be an http or https URL")
    if not url.host:
        raise ValueError("must name a host")
    if not _is_host(url.raw_host.decode("ascii")):
        raise ValueError(f"is not a valid URL: {url.host!r} is not a host name or IP address")
    if url.port is not None and not 1 <= url.port <= 65535:
        # httpx parses any integer; the connect then fails outside the fetch helpers' errors.
        raise ValueError(f"is not a valid URL: the port must be 1-65535, not {url.port}")
    if url.userinfo:
        raise ValueError("must not carry a user name or password (they would be stored and logged)")
    return value


def _is_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return _HOST_NAME.fullmatch(host) is not None
    return True


def default_webhook_urls(settings: Settings) -> dict[str, str]:
    """``SABRE_WEBHOOK_URLS`` (``tenant=url,…``) as ``{tenant: url}``; ValueError for a malformed
    entry (checked at start-up)."""
    urls: dict[str, str] = {}
    for raw in settings.webhook_urls.split(","):
        entry = raw.strip()
        if not entry:
            continue
        tenant, sep, url = entry.partition("=")
        if not sep or not tenant.strip() or not url.strip():
            raise ValueError(f"SABRE_WEBHOOK_URLS: expected tenant=url, got {entry[:40]!r}")
        try:
            urls[tenant.strip()] = check_webhook_url(url.strip())
        except ValueError as exc:
            raise ValueError(f"SABRE_WEBHOOK_URLS: {tenant.strip()}: the URL {exc}") from None
    return urls


def webhook_policy(settings: Settings) -> NetworkPolicy:
    """The SSRF guard for deliveries: public addresses, and the private ranges of
    ``SABRE_WEBHOOK_ALLOW``; ValueError for an entry that is not an IP address or CIDR range."""
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for raw in settings.webhook_allow.split(","):
        entry = raw.strip()
        if not entry:
            continue
        try:
            nets.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"SABRE_WEBHOOK_ALLOW: {entry!r} is not an IP address or CIDR range") from None
    # Not ``restricted``: listing a private range opens it without closing the public internet.
    return NetworkPolicy(allow_nets=tuple(nets))


async def tenant_secret(
    settings: Settings, *, sessionmaker: async_sessionmaker[AsyncSession], tenant: str
) -> str:
    """The secret ``tenant``'s receivers verify signatures with (``whsec_…``, Standard Webhooks):
    HMAC-SHA256 of the tenant under the server secret (``SABRE_WEBHOOK_SECRET``, else the store's)."""
    configured = settings.webhook_secret
    root = (
        configured.get_secret_value().encode()
        if configured is not None
        else await server_secret(sessionmaker, name=_SECRET_NAME)
    )
    key = hmac.new(root, b"sabre webhook secret\x00" + tenant.encode(), hashlib.sha256).digest()
    return "whsec_" + base64.b64encode(key).decode("ascii")


async def schedule_turn_webhook(
    resources: Resources,
    *,
    tenant: str,
    conversation_webhook_url: str | None,
    event_type: WebhookEventType,
    turn: dict[str, Any],
) -> None:
    """Queue the delivery of a turn's end to the conversation's webhook URL, else the tenant's
    default (``SABRE_WEBHOOK_URLS``), else nothing. Call it after the turn's final commit.

    Never raises: the turn is stored whatever happens here. A job that cannot be queued (the
    store is down) is logged as ``webhook_not_scheduled``; that webhook is not sent.
    """
    url = conversation_webhook_url or default_webhook_urls(resources.settings).get(tenant)
    if url is None:
        return
    now = datetime.now(UTC)
    payload = {"type": event_type, "timestamp": now.isoformat(), "data": turn}
    webhook_id = _webhook_id(event_type=event_type, turn=turn, at=now)
    try:
        job_id = await defer(
            resources.jobs,
            TASK,
            queue="webhooks",
            tenant=tenant,  # the job's share, and an argument of the task
            url=url,
            webhook_id=webhook_id,
            payload=payload,
        )
    except Exception:
        log.exception("webhook_not_scheduled", tenant=tenant, event_type=event_type, webhook_id=webhook_id)
        return
    log.info("webhook_scheduled", tenant=tenant, event_type=event_type, webhook_id=webhook_id, job_id=job_id)


def _webhook_id(*, event_type: str, turn: dict[str, Any], at: datetime) -> str:
    """The message id: derived from the turn, its end and the conversation's version, so the same
    end scheduled twice (a turn job run again after its worker died) carries the same id and the
    receiver can drop the duplicate; a turn without those fields gets a time-based id."""
    turn_id, version = turn.get("turn_id"), turn.get("version")
    seed = f"{turn_id}|{event_type}|{version}" if turn_id and version is not None else at.isoformat()
    return "whmsg_" + hashlib.sha256(seed.encode()).hexdigest()[:32]


class SinkingRetry(RetryStrategy):
    """Exponential backoff, each retry behind every first attempt (``RETRY_PRIORITY``): a job
    keeps its priority when retried, which fair shares would put ahead of newer jobs."""

    def get_retry_decision(self, *, exception: BaseException, job: Job) -> RetryDecision | None:
        """The backoff's decision, at ``RETRY_PRIORITY``."""
        decision = super().get_retry_decision(exception=exception, job=job)
        if decision is not None:
            decision.priority = RETRY_PRIORITY
        return decision


@blueprint.task(
    name=TASK,
    queue="webhooks",
    pass_context=True,
    retry=SinkingRetry(max_attempts=MAX_RETRIES, exponential_wait=2, retry_exceptions=[WebhookDeliveryError]),
)
async def deliver_webhook(
    context: JobContext, *, tenant: str, url: str, webhook_id: str, payload: dict[str, Any]
) -> None:
    """One attempt at POSTing a signed webhook (see the module docs for what is retried)."""
    resources = job_resources(context)
    settings = resources.settings
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    sent_at = datetime.now(UTC)
    secret = await tenant_secret(settings, sessionmaker=resources.sessionmaker, tenant=tenant)
    signature = Webhook(secret).sign(webhook_id, sent_at, body)
    headers = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(sent_at.timestamp())),
        "webhook-signature": signature,
    }
    attempt = context.job.attempts + 1
    where = {
        "tenant": tenant,
        "webhook_id": webhook_id,
        "event_type": payload.get("type"),
        "attempt": attempt,
    }
    try:
        response = await fetch(
            url,
            policy=webhook_policy(settings),
            limits=FetchLimits(
                max_bytes=_MAX_RESPONSE_BYTES,
                timeout_seconds=settings.webhook_timeout_seconds,
                max_redirects=0,
            ),
            method="POST",
            headers=headers,
            content=body.encode(),
            follow_redirects=False,
            raise_for_status=False,
        )
    except NetworkDenied as exc:
        # The guard's words are the helpers'; for webhooks the allow list is a server setting.
        reason = f"{exc} (for webhooks: SABRE_WEBHOOK_ALLOW)"
        log.warning("webhook_refused", **where, reason=reason)
        raise WebhookRefused(reason) from None
    except FetchError as exc:
        log.info("webhook_attempt_failed", **where, reason=str(exc))
        raise WebhookDeliveryError(str(exc)) from None
    if not 200 <= response.status < 300:
        log.info("webhook_attempt_failed", **where, reason=f"HTTP {response.status}")
        raise WebhookDeliveryError(f"{url}: HTTP {response.status}")
    log.info("webhook_delivered", **where, status=response.status)
