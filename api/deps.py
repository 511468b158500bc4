"""Dependencies every route shares: settings, the Redis client and bearer-token auth."""

from __future__ import annotations

import hmac

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis import Redis

from shared.config import Settings
from shared.keys import Keys
from shared.tasks import Access

_bearer = HTTPBearer(auto_error=False, description="Bearer token (ROLLOUTS_API_TOKENS); off when none is set.")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_redis(request: Request) -> Redis:
    return request.app.state.redis


def get_keys(request: Request) -> Keys:
    return request.app.state.keys


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
