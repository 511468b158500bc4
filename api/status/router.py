"""The service's state: liveness (`/healthz`, no auth), the operator's status (`/v1/status`), Prometheus (`/metrics`).

Three routers, for their tags and auth; each reads through shared/jobs/service_status.py or the collector.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import get_store, require_auth
from api.status.prometheus import RedisCollector
from api.status.schemas import ServiceStatus
from shared.jobs.service_status import liveness
from shared.jobs.service_status import service_status as read_status
from shared.jobs.store import JobStore

health_router = APIRouter(tags=["health"])
status_router = APIRouter(prefix="/v1", tags=["status"], dependencies=[Depends(require_auth)])
metrics_router = APIRouter(tags=["metrics"], dependencies=[Depends(require_auth)])


@health_router.get("/healthz", summary="Liveness, Redis reachability and the results store's health")
def healthz(store: JobStore = Depends(get_store)) -> JSONResponse:
    body = liveness(store)
    return JSONResponse(body, status_code=503 if body["status"] != "ok" else 200)


@status_router.get("/status", response_model=ServiceStatus, summary="Queue depths, workers per stage, in-flight counts")
def service_status(store: JobStore = Depends(get_store)) -> ServiceStatus:
    return ServiceStatus(**read_status(store))


@metrics_router.get(
    "/metrics",
    summary="Prometheus metrics (text exposition format)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}},
)
def metrics(store: JobStore = Depends(get_store)) -> Response:
    return Response(generate_latest(RedisCollector(store)), media_type=CONTENT_TYPE_LATEST)  # type: ignore[arg-type]
