"""Redis connections built from settings, with the options every process needs."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, OutOfMemoryError, ReadOnlyError, ResponseError, TimeoutError
from redis.retry import Retry

from shared.config import Settings
from shared.errors import RolloutsError

# redis-py 8 caps a client's connection pool at 100 by default (earlier versions did not cap it).
# A worker process shares one client among all its threads: every rq slot holds a connection
# while it blocks waiting for a job, and the rollout's LLM-call threads, the supervisor and
# maintenance need more, so a 100-slot process ran out (MaxConnectionsError crashed slots and
# re-queued finished stages until their retries ran out). A pool grows only to the number of
# threads using it at once, so this cap is just a backstop; Redis's maxclients (10,000 by
# default) is the real bound.
MAX_CONNECTIONS = 10_000


# What a client retries: the server gone (refused, reset) or not answering in time.
RETRIED = (ConnectionError, TimeoutError)


# What redis-py puts in front of a pipeline command's error ("Command # 2 (SET ...) of pipeline caused error: ").
_PIPELINE_NOTE = "of pipeline caused error: "


def write_refusal(exc: BaseException) -> str | None:
    """Redis' own reason when `exc` is Redis up but refusing writes it cannot keep, else None.

    MISCONF: its AOF or RDB write failed (its disk is full); READONLY: a replica; OOM: maxmemory
    under noeviction. None of these is the job's fault, and each passes once the server can write
    again, so the API answers 503 and the workers hold their results and retry, as for an outage.
    """
    if not isinstance(exc, ResponseError):
        return None
    message = str(exc).partition(_PIPELINE_NOTE)[2] or str(exc)
    if isinstance(exc, ReadOnlyError | OutOfMemoryError) or message.startswith("MISCONF "):
        return message
    return None


class RedisNotConfigured(RolloutsError, RuntimeError):
    """Raised where a process needs Redis but none was configured or started."""


def connect(settings: Settings, *, decode_responses: bool = False) -> Redis:
    """A patient client for workers and the CLI: it retries through a short Redis outage (a restart)
    instead of failing the job; longer outages are ridden out by the callers (slot restarts)."""
    return Redis.from_url(
        _url(settings),
        decode_responses=decode_responses,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=8, supported_errors=RETRIED),
        socket_connect_timeout=5.0,
        socket_keepalive=True,
        socket_keepalive_options=tcp_liveness_options(settings),
        max_connections=MAX_CONNECTIONS,
    )


def connect_for_requests(settings: Settings) -> Redis:
    """The API's client: while Redis is away a request fails fast (the API answers 503 with
    Retry-After, the client retries) rather than holding the caller through the patient client's
    ~7 s of retries. One quick retry covers a pooled connection that Redis closed; a frozen Redis
    (accepting, never answering) costs one `redis_request_timeout_s`."""
    return Redis.from_url(_url(settings), **_fail_fast_options(settings, Retry))


def connect_for_requests_async(settings: Settings) -> AsyncRedis:
    """`connect_for_requests` for an async route on the API's hot path (an external agent's every
    call): the same fail-fast timeouts and retry, without a thread-pool hop per request."""
    return AsyncRedis.from_url(_url(settings), **_fail_fast_options(settings, AsyncRetry))


def _fail_fast_options(settings: Settings, retry: type[Retry] | type[AsyncRetry]) -> dict[str, Any]:
    """The API's client options, sync or async alike (`retry` is redis-py's Retry class of either)."""
    timeout = settings.redis_request_timeout_s
    return {
        "health_check_interval": 30,
        "retry": retry(ExponentialBackoff(cap=0.05, base=0.01), retries=1, supported_errors=(ConnectionError,)),
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout,
        "socket_keepalive": True,
        "socket_keepalive_options": tcp_liveness_options(settings),
        "max_connections": MAX_CONNECTIONS,
    }


def tcp_liveness_options(settings: Settings) -> dict[int, int]:
    """TCP options that bound how long a dead network path to Redis goes unnoticed: an idle connection is probed
    after half of `redis_tcp_user_timeout_s` and dropped when three probes go unanswered; a connection whose sent
    data stays unacknowledged (a blocked write, a blackholed peer) is dropped after the whole of it. Without them
    a worker cut off mid-write waits out the kernel's retransmissions (~15 min) before its slots restart. Options
    this platform lacks (macOS has no TCP_KEEPIDLE nor TCP_USER_TIMEOUT) are left out."""
    timeout = settings.redis_tcp_user_timeout_s
    wanted = {
        "TCP_KEEPIDLE": max(1, int(timeout / 2)),
        "TCP_KEEPINTVL": max(1, int(timeout / 6)),
        "TCP_KEEPCNT": 3,
        "TCP_USER_TIMEOUT": int(timeout * 1000),
    }
    return {getattr(socket, name): value for name, value in wanted.items() if hasattr(socket, name)}


def _url(settings: Settings) -> str:
    if not settings.redis_url:
        raise RedisNotConfigured(
            "ROLLOUTS_REDIS_URL is not set (nor ROLLOUTS_REDIS_URL_FILE to a file holding it); "
            "start the stack with `rollouts up` or point it at a Redis"
        )
    return settings.redis_url


def write_url_file(path: Path, url: str) -> None:
    """Write the URL (with its password) where only this user can read it: created 0600, never a
    moment readable by others, and a link planted at `path` is not followed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(fd, 0o600)  # an existing file keeps its old mode through O_CREAT
        out.write(url + "\n")


def redact_url(url: str | None) -> str:
    """The URL with any password replaced by `***`, for logs, status pages and messages."""
    if not url:
        return ""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
