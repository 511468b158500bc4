"""The token an external agent holds for its one job: derived from a deployment secret, never stored.

`job_token(secret, job_id)` is an HMAC of the job id, so the API (which hands it out and checks it
before forwarding) and the rollout worker (which checks it again on its own port) agree without
writing any key anywhere; a token opens exactly one job, and another job's token is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from redis import Redis

from shared.config import Settings
from shared.keys import Keys

TOKEN_PREFIX = "rk-"
# a worker's agent endpoint names its job in every answer (api/external_agent/endpoint_cache.py)
JOB_HEADER = "x-rollouts-job"
# which of the job's conversations a call belongs to, when the agent names it (docs/TRAJECTORY.md); the API forwards it
CONVERSATION_HEADER = "x-rollouts-conversation"


def deployment_secret(redis: Redis, keys: Keys, settings: Settings) -> bytes:
    """The configured secret, else the one the first process to ask made and kept in Redis (SET NX)."""
    if settings.external_agent_secret:
        return settings.external_agent_secret.encode()
    redis.set(keys.external_agent_secret, secrets.token_hex(32), nx=True)
    value = redis.get(keys.external_agent_secret)
    if value is None:  # flushed between the two calls: make it again
        return deployment_secret(redis, keys, settings)
    return value if isinstance(value, bytes) else str(value).encode()


def job_token(secret: bytes, job_id: str) -> str:
    """The bearer token of `job_id`'s agent endpoint."""
    return TOKEN_PREFIX + hmac.new(secret, job_id.encode(), hashlib.sha256).hexdigest()


def token_opens(secret: bytes, job_id: str, key: str | None) -> bool:
    """Whether `key` is `job_id`'s (constant-time)."""
    return key is not None and hmac.compare_digest(key.encode(), job_token(secret, job_id).encode())


def presented_token(authorization: str | None, x_api_key: str | None) -> str | None:
    """The token an agent presents: `Authorization: Bearer <key>` (OpenAI clients) or `x-api-key: <key>`
    (Anthropic clients)."""
    return bearer(authorization) or (x_api_key.strip() if x_api_key and x_api_key.strip() else None)


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
