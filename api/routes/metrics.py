"""Prometheus scrape endpoint: the service's state and the workers' aggregates, read from Redis."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import require_auth
from api.metrics import RedisCollector

router = APIRouter(tags=["metrics"], dependencies=[Depends(require_auth)])


@router.get(
    "/metrics",
    summary="Prometheus metrics (text exposition format)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}},
)
def metrics(request: Request) -> Response:
    state = request.app.state
    collector = RedisCollector(state.redis, state.keys, state.settings)
    return Response(generate_latest(collector), media_type=CONTENT_TYPE_LATEST)  # type: ignore[arg-type]
