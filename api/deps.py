"""What a route receives: the app's settings, stores and clients (made once per process), admission and auth.

Routers take these and call shared/ with them; they never call Redis nor name a key themselves (an
import-linter contract keeps `redis` and `shared.keys` out of every api/<area>/router.py).
"""

from __future__ import annotations

import hmac

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.job_events import fail_fast_redis
from shared.backend_pool import BackendPool
from shared.batches.replenish import batch_store
from shared.batches.store import BatchStore
from shared.batches.stream import GroupStream, stream_client
from shared.config import Settings
from shared.jobs.admission import refusal
from shared.jobs.agent_endpoints import AgentEndpoints
from shared.jobs.store import JobStore
from shared.keys import BatchKeys
from shared.tasks import Access

_bearer = HTTPBearer(auto_error=False, description="Bearer token (ROLLOUTS_API_TOKENS); off when none is set.")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> JobStore:
    return request.app.state.store


def get_pool(request: Request) -> BackendPool:
    """One pool per app (its Lua scripts are registered once), rebuilt if the Redis client changes."""
    state = request.app.state
    pool = getattr(state, "backend_pool", None)
    if pool is None or pool.redis is not state.redis:
        pool = state.backend_pool = BackendPool(state.redis, state.keys, state.settings)
    return pool


def get_batches(request: Request) -> BatchStore:
    return batch_store(request.app.state.store)


def get_group_stream(request: Request) -> GroupStream:
    """The batches' streams on one redis.asyncio client per app, made on first use (closed by the app)."""
    state = request.app.state
    stream: GroupStream | None = getattr(state, "group_stream", None)
    if stream is None:
        stream = state.group_stream = GroupStream(stream_client(state.settings), BatchKeys(state.keys.prefix))
    return stream


def get_agent_endpoints(request: Request) -> AgentEndpoints:
    """Where external agents' jobs are served, read on the hot path's fail-fast async client."""
    state = request.app.state
    endpoints: AgentEndpoints | None = getattr(state, "agent_endpoints", None)
    if endpoints is None:
        endpoints = state.agent_endpoints = AgentEndpoints(fail_fast_redis(request), state.keys)
    return endpoints


def require_room(request: Request) -> None:
    """Dependency of every submission: 503 with Retry-After, naming the reason, when there is no room."""
    state = request.app.state
    reason = refusal(state.store)
    if reason is not None:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=f"not accepting new jobs: {reason}",
            headers={"Retry-After": str(state.settings.admission_retry_after_s)},
        )


def _token_in(token: str, allowed: list[str]) -> bool:
    # Compare against every token in constant time so timing leaks neither a token nor which one matched.
    matched = False
    for candidate in allowed:
        matched |= hmac.compare_digest(token.encode(), candidate.encode())
    return matched


def require_auth(
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
    settings: Settings = Depends(get_settings),
) -> None:
    """Every route but health: a valid bearer token when tokens are configured."""
    allowed = settings.api_tokens + settings.admin_tokens
    if not allowed:
        return
    if credentials is None or not _token_in(credentials.credentials, allowed):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )


def _is_admin(credentials: HTTPAuthorizationCredentials | None, settings: Settings) -> bool:
    """An admin token, or any API token when no admin tokens are set (or anyone, with auth off)."""
    allowed = settings.admin_tokens or settings.api_tokens
    return not allowed or (credentials is not None and _token_in(credentials.credentials, allowed))


def require_admin(
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
    settings: Settings = Depends(get_settings),
) -> None:
    """Admin routes (backend registration, cancel): an admin token, or any API token when no admin tokens are set.

    With admin tokens unset every caller is trusted equally (one team, one token), so existing
    deployments keep working; setting them splits trainers (submit, read) from operators.
    """
    if _is_admin(credentials, settings):
        return
    if credentials is None or not _token_in(credentials.credentials, settings.api_tokens + settings.admin_tokens):
        # Who is asking is unknown: authenticate first (401), as on every other route.
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    raise HTTPException(status.HTTP_403_FORBIDDEN, detail="this route needs an admin token")


def submitter_access(
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
    settings: Settings = Depends(get_settings),
) -> Access:
    """What a submitter may choose: execution settings inline only as an admin; the operator's profiles always."""
    return Access(admin=_is_admin(credentials, settings), profiles=settings.task_profiles)
