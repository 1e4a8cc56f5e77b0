"""Per-tenant limits: requests per window, turns at once, model tokens per window, event streams open.

The counters live in Redis when the service has one (every replica and worker shares them), else
in this process (each ``sabre serve`` process then counts on its own: README, "Tenant limits").
Every check runs before the request writes anything or starts a turn, so a refused request leaves
nothing behind. Rates use the ``limits`` library (a sliding window counter: one round trip per
request); token quotas a fixed window that turns add their recorded usage to when they end; the
turns a tenant has at once, a set of leases (a turn's lease is renewed while it runs, so a runner
that died frees its place once the lease lapses); the event streams a tenant holds open, a count in
this process (what a stream holds, a socket, a task and a bus subscription, is this process's).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from limits import RateLimitItem, parse_many
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import FixedWindowRateLimiter, SlidingWindowCounterRateLimiter
from redis.asyncio import Redis

from app.config import Settings
from app.kit.errors import TooManyRequests
from app.kit.metrics import LIMITED

_TURNS_KEY: Final = "sabre:tenant-turns:"
# Leases of the turns a tenant has at once: drop the lapsed, then add this turn if there is room.
_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZSCORE', KEYS[1], ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
  return 1
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


class RateLimited(TooManyRequests):
    """The tenant's requests are over a rate window."""

    code = "rate_limited"
    title = "Too many requests"


class ConcurrentTurnsLimited(TooManyRequests):
    """The tenant has its most turns queued or running."""

    code = "concurrent_turns_limited"
    title = "Too many turns at once"


class ConcurrentStreamsLimited(TooManyRequests):
    """The tenant holds its most event streams open in this process."""

    code = "concurrent_streams_limited"
    title = "Too many event streams open"


class TokenQuotaExceeded(TooManyRequests):
    """The tenant's turns have used its model tokens for the window (429: the window resets)."""

    code = "token_quota_exceeded"
    title = "Token quota exhausted"


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """One tenant's limits (empty: none)."""

    rates: tuple[RateLimitItem, ...] = ()
    max_concurrent_turns: int = 0  # 0: unlimited
    token_quota: RateLimitItem | None = None
    max_event_streams: int = 0  # 0: unlimited

    @property
    def limits_turns(self) -> bool:
        """Whether starting a turn is checked at all."""
        return self.max_concurrent_turns > 0 or self.token_quota is not None


def _items(text: str, *, where: str) -> tuple[RateLimitItem, ...]:
    if not text.strip():
        return ()
    try:
        return tuple(parse_many(text))
    except ValueError:
        raise ValueError(
            f"{where}: {text!r} is not a limit such as '120/minute' (several separated by ';')"
        ) from None


def parse_policies(settings: Settings) -> tuple[TenantPolicy, dict[str, TenantPolicy]]:
    """The default policy and the per-tenant overrides; ``ValueError`` says what is malformed."""
    quota = _items(settings.token_quota, where="SABRE_TOKEN_QUOTA")
    default = TenantPolicy(
        rates=_items(settings.rate_limit, where="SABRE_RATE_LIMIT"),
        max_concurrent_turns=settings.max_concurrent_turns,
        token_quota=quota[0] if quota else None,
        max_event_streams=settings.max_event_streams,
    )
    if not settings.tenant_limits.strip():
        return default, {}
    try:
        raw = json.loads(settings.tenant_limits)
    except json.JSONDecodeError as exc:
        raise ValueError(f"SABRE_TENANT_LIMITS is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError('SABRE_TENANT_LIMITS: expected {"tenant": {"rate_limit": …}, …}')
    known = {"rate_limit", "max_concurrent_turns", "token_quota", "max_event_streams"}
    overrides: dict[str, TenantPolicy] = {}
    for tenant, values in raw.items():
        where = f"SABRE_TENANT_LIMITS[{tenant!r}]"
        if not isinstance(values, dict) or not set(values) <= known:
            raise ValueError(f"{where}: expected an object with keys among {sorted(known)}")
        turns = values.get("max_concurrent_turns", default.max_concurrent_turns)
        if not isinstance(turns, int) or isinstance(turns, bool) or turns < 0:
            raise ValueError(f"{where}.max_concurrent_turns: expected an integer >= 0")
        streams = values.get("max_event_streams", default.max_event_streams)
        if not isinstance(streams, int) or isinstance(streams, bool) or streams < 0:
            raise ValueError(f"{where}.max_event_streams: expected an integer >= 0")
        rates = (
            _items(str(values["rate_limit"]), where=f"{where}.rate_limit")
            if "rate_limit" in values
            else default.rates
        )
        quota = (
            _items(str(values["token_quota"]), where=f"{where}.token_quota")
            if "token_quota" in values
            else ((default.token_quota,) if default.token_quota else ())
        )
        overrides[str(tenant)] = TenantPolicy(
            rates=rates,
            max_concurrent_turns=turns,
            token_quota=quota[0] if quota else None,
            max_event_streams=streams,
        )
    return default, overrides


def _seconds(item: RateLimitItem) -> int:
    return int(item.get_expiry())


def _limit_headers(item: RateLimitItem, *, name: str, remaining: int, reset_in: int) -> dict[str, str]:
    """Retry-After and the IETF RateLimit / RateLimit-Policy fields (draft-ietf-httpapi-ratelimit-headers)."""
    return {
        "Retry-After": str(reset_in),
        "RateLimit-Policy": f'"{name}";q={item.amount};w={_seconds(item)}',
        "RateLimit": f'"{name}";r={remaining};t={reset_in}',
    }


@dataclass(slots=True)
class _LocalLeases:
    """The in-process stand-in for the Redis lease sets (one process's turns only)."""

    leases: dict[str, dict[str, float]] = field(default_factory=dict)

    def acquire(self, tenant: str, turn_id: str, *, now: float, until: float, limit: int) -> bool:
        held = self.leases.setdefault(tenant, {})
        for other in [t for t, expiry in held.items() if expiry <= now]:
            del held[other]
        if turn_id not in held and len(held) >= limit:
            return False
        held[turn_id] = until
        return True

    def renew(self, tenant: str, turn_id: str, *, until: float) -> None:
        held = self.leases.get(tenant, {})
        if turn_id in held:
            held[turn_id] = until

    def release(self, tenant: str, turn_id: str) -> None:
        self.leases.get(tenant, {}).pop(turn_id, None)


class TenantLimiter:
    """Checks and counts the per-tenant limits of one process (shared through Redis when there is one)."""

    def __init__(self, settings: Settings, *, redis: Redis | None) -> None:
        self.default, self.overrides = parse_policies(settings)
        self.lease_seconds = settings.lock_lease_seconds
        self._set_ttl = math.ceil(self.lease_seconds) + 60  # seconds the Redis set outlives a renewal
        policies = [self.default, *self.overrides.values()]
        self.limits_requests = any(p.rates for p in policies)
        self.limits_turns = any(p.limits_turns for p in policies)
        self._redis = redis
        self._storage: Storage | None = None
        if self.limits_requests or any(p.token_quota for p in policies):
            self._storage = (
                RedisStorage(
                    "async+" + settings.redis_url, implementation="redispy", key_prefix="sabre-limits"
                )
                if settings.redis_url
                else MemoryStorage()
            )
        self._rates = SlidingWindowCounterRateLimiter(self._storage) if self._storage is not None else None
        self._tokens = FixedWindowRateLimiter(self._storage) if self._storage is not None else None
        self._acquire = redis.register_script(_ACQUIRE) if redis is not None else None
        self._local = _LocalLeases()
        self._streams: dict[str, int] = {}  # event streams open in this process, by tenant

    def policy(self, tenant: str) -> TenantPolicy:
        """The limits that apply to ``tenant``."""
        return self.overrides.get(tenant, self.default)

    async def check_request(self, tenant: str) -> None:
        """Count one request of ``tenant``; ``RateLimited`` (429) when a window is full."""
        if not self.limits_requests or self._rates is None:
            return
        for item in self.policy(tenant).rates:
            if await self._rates.hit(item, tenant):
                continue
            stats = await self._rates.get_window_stats(item, tenant)
            reset_in = max(1, math.ceil(stats.reset_time - time.time()))
            LIMITED.labels(tenant=tenant, limit="rate").inc()
            raise RateLimited(
                f"Tenant {tenant!r} is over its rate limit of {item.amount} requests per "
                f"{_seconds(item)} s; retry in {reset_in} s.",
                headers=_limit_headers(item, name="requests", remaining=stats.remaining, reset_in=reset_in),
            )

    async def acquire_turn(self, tenant: str, turn_id: str) -> bool:
        """Before a turn starts (nothing written yet): refuse it when the tenant's token quota is
        spent or it has its most turns running; else hold a place for it. Whether one is held
        (release it with :meth:`release_turn` when the turn ends)."""
        policy = self.policy(tenant)
        if not policy.limits_turns:
            return False
        quota = policy.token_quota
        if quota is not None and self._tokens is not None and not await self._tokens.test(quota, tenant):
            stats = await self._tokens.get_window_stats(quota, tenant)
            reset_in = max(1, math.ceil(stats.reset_time - time.time()))
            LIMITED.labels(tenant=tenant, limit="token_quota").inc()
            raise TokenQuotaExceeded(
                f"Tenant {tenant!r} has used its {quota.amount} model tokens for this "
                f"{_seconds(quota)} s window; retry in {reset_in} s.",
                headers=_limit_headers(quota, name="tokens", remaining=0, reset_in=reset_in),
            )
        limit = policy.max_concurrent_turns
        if limit <= 0:
            return False
        now = time.time()
        until = now + self.lease_seconds
        if self._acquire is not None:
            args: list[str | float] = [now, until, limit, turn_id, self._set_ttl]
            held = bool(await self._acquire(keys=[_TURNS_KEY + tenant], args=args))
        else:
            held = self._local.acquire(tenant, turn_id, now=now, until=until, limit=limit)
        if not held:
            LIMITED.labels(tenant=tenant, limit="concurrent_turns").inc()
            raise ConcurrentTurnsLimited(
                f"Tenant {tenant!r} already has {limit} turn(s) queued or running; retry when one ends.",
                headers={"Retry-After": "1"},
            )
        return True

    async def renew_turn(self, tenant: str, turn_id: str) -> None:
        """Extend a running turn's place (called with its lock's renewal)."""
        if self.policy(tenant).max_concurrent_turns <= 0:
            return
        until = time.time() + self.lease_seconds
        if self._redis is not None:
            key = _TURNS_KEY + tenant
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zadd(key, {turn_id: until}, xx=True)
                pipe.expire(key, self._set_ttl)  # the set outlives its longest lease
                await pipe.execute()
        else:
            self._local.renew(tenant, turn_id, until=until)

    async def release_turn(self, tenant: str, turn_id: str) -> None:
        """Give a turn's place back (it ended, failed, or never started); a no-op when not held."""
        if self.policy(tenant).max_concurrent_turns <= 0:
            return
        if self._redis is not None:
            await self._redis.zrem(_TURNS_KEY + tenant, turn_id)
        else:
            self._local.release(tenant, turn_id)

    def open_stream(self, tenant: str) -> Callable[[], None]:
        """Before an event stream starts: refuse it (``ConcurrentStreamsLimited``, 429) when the
        tenant already holds its most streams open in this process, else count it. Each one holds
        a socket, tasks and a bus subscription (without a bus across processes, a read of the store
        every 0.25 s) for as long as its client keeps it, hours with ``follow=true``. Returns the
        stream's release, to call once when it ends (calling it again does nothing)."""
        limit = self.policy(tenant).max_event_streams
        held = self._streams.get(tenant, 0)
        if limit > 0 and held >= limit:
            LIMITED.labels(tenant=tenant, limit="event_streams").inc()
            raise ConcurrentStreamsLimited(
                f"Tenant {tenant!r} already has {limit} event stream(s) open; close one first.",
                headers={"Retry-After": "1"},
            )
        self._streams[tenant] = held + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._streams.get(tenant, 1) - 1
            if left > 0:
                self._streams[tenant] = left
            else:
                self._streams.pop(tenant, None)

        return release

    async def add_tokens(self, tenant: str, tokens: int) -> None:
        """Count a finished turn's model tokens against the tenant's quota."""
        quota = self.policy(tenant).token_quota
        if quota is not None and self._tokens is not None and tokens > 0:
            await self._tokens.hit(quota, tenant, cost=tokens)
