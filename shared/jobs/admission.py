"""Whether the service has room for new jobs: Redis below its high-water mark, the results store healthy.

Jobs already accepted go on either way; only new submissions are refused (the API's 503 with
Retry-After), so a full Redis or a lost results directory stops the intake before it loses work.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis

from shared.config import Settings
from shared.jobs.store import JobStore


@dataclass(frozen=True)
class RedisMemory:
    used: int
    limit: int  # maxmemory in bytes; 0 when neither Redis nor the settings name one
    high_water: float  # the fraction of `limit` above which submissions are refused

    @property
    def over_high_water(self) -> bool:
        return self.limit > 0 and self.used >= self.high_water * self.limit


def redis_memory(redis: Redis, settings: Settings) -> RedisMemory:
    """Redis's used memory and its limit (its own maxmemory, else the configured size)."""
    info = redis.info("memory")
    limit = int(info.get("maxmemory") or 0) or (settings.redis_maxmemory_bytes or 0)
    return RedisMemory(used=int(info["used_memory"]), limit=limit, high_water=settings.redis_high_water)


def refusal(store: JobStore) -> str | None:
    """Why new jobs cannot be taken now, or None."""
    health = store.results.health()
    if not health.healthy:
        return f"the results store is unhealthy: {health.reason}"
    memory = redis_memory(store.redis, store.settings)
    if memory.over_high_water:
        return (
            f"Redis memory is above its high-water mark: {memory.used} of {memory.limit} bytes used "
            f"(refusing above {memory.high_water:.0%}); finished jobs' records expire, or raise redis_maxmemory_bytes"
        )
    return None
