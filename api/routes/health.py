"""Liveness: no auth, a Redis ping and a look at the results directory, so load balancers can poll it cheaply."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from redis import Redis

from api.deps import get_redis

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness, Redis reachability and the results store's health")
def healthz(request: Request, redis: Redis = Depends(get_redis)) -> JSONResponse:
    body = {"status": "ok", "redis": "ok", "results": "ok"}
    try:
        redis.ping()
    except Exception as exc:  # noqa: BLE001 - any Redis failure means "not healthy", never a 500
        body["redis"] = f"unreachable: {type(exc).__name__}"
    results = request.app.state.store.results.health()
    if not results.healthy:
        body["results"] = results.reason
    if body["redis"] != "ok" or body["results"] != "ok":
        body["status"] = "degraded"
        return JSONResponse(body, status_code=503)
    return JSONResponse(body)
