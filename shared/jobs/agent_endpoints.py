"""Where each external agent's job is served: the rollout worker's endpoint (`Keys.external_agent_endpoint`).

The rollout stage sets it while it serves the job; the API reads it, with the job's status, on every
call it has no remembered route for, so the read is one round trip on the event loop (redis.asyncio).
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis as AsyncRedis

from shared.keys import Keys


@dataclass(frozen=True)
class AgentEndpoint:
    """A job's status (None: no such job) and where its agent is served (None: not serving)."""

    status: str | None
    url: str | None


class AgentEndpoints:
    """Reads of where external agents' jobs are served, on the API's fail-fast async client."""

    def __init__(self, redis: AsyncRedis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def lookup(self, job_id: str) -> AgentEndpoint:
        """The job's status and its endpoint, in one pipelined round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(self.keys.job(job_id), "status")
            pipe.get(self.keys.external_agent_endpoint(job_id))
            status, url = await pipe.execute()
        return AgentEndpoint(_text(status), _text(url))


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
