"""Service status: queue depths, workers per stage and jobs by status, read straight from Redis."""

from __future__ import annotations

from collections import defaultdict

from fastapi import APIRouter, Depends, Request
from redis import Redis

from api.admission import redis_memory
from api.deps import get_redis, require_auth
from api.schemas import ServiceStatus
from shared.config import STAGES
from shared.jobs.queues import stage_queue, stage_workers
from shared.jobs.status import TERMINAL

router = APIRouter(prefix="/v1", tags=["status"], dependencies=[Depends(require_auth)])


@router.get("/status", response_model=ServiceStatus, summary="Queue depths, workers per stage, in-flight counts")
def service_status(request: Request, redis: Redis = Depends(get_redis)) -> ServiceStatus:
    stages = {}
    for stage in STAGES:
        queue = stage_queue(stage, redis)
        workers = stage_workers(stage, queue.connection)
        processes: dict[str, int] = defaultdict(int)
        busy = 0
        for worker in workers:
            # Slot workers are named "<process name>.<slot>"; a plain rq worker counts as its own process.
            processes[worker.name.rsplit(".", 1)[0]] += 1
            busy += worker.get_state() == "busy"
        stages[stage] = {
            "queued": queue.count,
            "running": redis.zcard(queue.started_job_registry.key),  # .count would run cleanup here
            "failed": redis.zcard(queue.failed_job_registry.key),
            "processes": len(processes),
            "slots": len(workers),
            "busy_slots": busy,
        }
    store = request.app.state.store
    jobs = store.counts_by_status()
    memory = redis_memory(redis, request.app.state.settings)
    health = store.results.health()
    restarts = {_text(kind): int(count) for kind, count in redis.hgetall(request.app.state.keys.stack_restarts).items()}
    return ServiceStatus(
        stages=stages,
        jobs=jobs,
        in_flight=sum(count for status, count in jobs.items() if status not in TERMINAL),
        redis={
            "used_bytes": memory.used,
            "limit_bytes": memory.limit,
            "high_water": memory.high_water,
            "accepting": not memory.over_high_water,
        },
        results={
            "root": str(store.results.root),
            **store.results_usage(),
            "healthy": health.healthy,
            "reason": health.reason,
        },
        restarts=restarts,
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
