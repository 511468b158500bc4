"""Liveness: no auth, no Redis round trip beyond a ping, so load balancers can poll it cheaply."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from redis import Redis

from api.deps import get_redis

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness and Redis reachability")
def healthz(redis: Redis = Depends(get_redis)) -> JSONResponse:
    try:
        redis.ping()
    except Exception as exc:  # any Redis failure means "not healthy", never a 500
        return JSONResponse({"status": "degraded", "redis": f"unreachable: {type(exc).__name__}"}, status_code=503)
    return JSONResponse({"status": "ok", "redis": "ok"})
