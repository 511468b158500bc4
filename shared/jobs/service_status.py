"""The service's state as an operator reads it: each stage's queue and workers, jobs by status, storage.

Read straight from Redis (rq's queues and registries, the job indexes) and the results store, so any
API replica answers alike; `liveness` is the cheap part a load balancer polls.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from shared.config import STAGES
from shared.jobs.admission import redis_memory
from shared.jobs.queues import stage_queue, stage_workers
from shared.jobs.status import TERMINAL
from shared.jobs.store import JobStore
from shared.redis_conn import write_refusal


def service_status(store: JobStore) -> dict[str, Any]:
    """Queue depths, workers per stage, jobs by status, Redis memory, the results store, restarts."""
    redis = store.redis
    jobs = store.counts_by_status()
    memory = redis_memory(redis, store.settings)
    health = store.results.health()
    restarts = {_text(kind): int(count) for kind, count in redis.hgetall(store.keys.stack_restarts).items()}
    return {
        "stages": {stage: _stage_status(store, stage) for stage in STAGES},
        "jobs": jobs,
        "in_flight": sum(count for status, count in jobs.items() if status not in TERMINAL),
        "redis": {
            "used_bytes": memory.used,
            "limit_bytes": memory.limit,
            "high_water": memory.high_water,
            "accepting": not memory.over_high_water,
        },
        "results": {
            "root": str(store.results.root),
            **store.results_usage(),
            "healthy": health.healthy,
            "reason": health.reason,
        },
        "restarts": restarts,
    }


def _stage_status(store: JobStore, stage: str) -> dict[str, int]:
    """One stage's rq queue and the worker slots listening on it."""
    redis = store.redis
    queue = stage_queue(stage, redis)
    workers = stage_workers(stage, queue.connection)
    processes: dict[str, int] = defaultdict(int)
    busy = 0
    for worker in workers:
        # Slot workers are named "<process name>.<slot>"; a plain rq worker counts as its own process.
        processes[worker.name.rsplit(".", 1)[0]] += 1
        busy += worker.get_state() == "busy"
    return {
        "queued": queue.count,
        "running": redis.zcard(queue.started_job_registry.key),  # .count would run cleanup here
        "failed": redis.zcard(queue.failed_job_registry.key),
        "processes": len(processes),
        "slots": len(workers),
        "busy_slots": busy,
    }


def liveness(store: JobStore) -> dict[str, str]:
    """`status` ok or degraded, with Redis's reachability and the results store's health, each ok or why not."""
    body = {"status": "ok", "redis": "ok", "results": "ok"}
    try:
        store.redis.ping()
    except Exception as exc:  # noqa: BLE001 - any Redis failure means "not healthy", never a 500
        refusal = write_refusal(exc)  # up, but refusing writes (its disk full): not "unreachable"
        body["redis"] = f"refusing writes: {refusal}" if refusal else f"unreachable: {type(exc).__name__}"
    results = store.results.health()
    if not results.healthy:
        body["results"] = results.reason
    if body["redis"] != "ok" or body["results"] != "ok":
        body["status"] = "degraded"
    return body


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
