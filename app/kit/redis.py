"""The Redis client the lifespan owns (optional: without it, locks fall back to the database)."""

from __future__ import annotations

from redis.asyncio import Redis


def create_redis(url: str) -> Redis:
    """A pooled client that returns bytes; callers decode what they read."""
    return Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10, health_check_interval=30)
