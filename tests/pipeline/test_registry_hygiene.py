"""The failed registry that /v1/status counts holds only jobs whose records failed at that stage."""

from __future__ import annotations

from redis import Redis

from shared.codec import pack
from shared.config import Settings
from shared.jobs.queues import stage_queue
from shared.jobs.status import JobStatus
from shared.jobs.store import JobStore
from workers.runtime.registry_hygiene import prune_failed_registry


def record(redis: Redis, store: JobStore, job_id: str, status: str, error: dict | None = None) -> None:
    redis.hset(store.keys.job(job_id), mapping={"status": status, **({"error": pack(error)} if error else {})})


def test_only_entries_backed_by_a_failed_record_at_that_stage_stay(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    queue = stage_queue("rollout", redis)
    ids = {name: f"{n:032x}" for n, name in enumerate(["failed_here", "done", "failed_in_eval", "gone", "cancelled"], 1)}
    record(redis, store, ids["failed_here"], JobStatus.FAILED, {"stage": "rollout", "type": "worker_lost"})
    record(redis, store, ids["done"], JobStatus.DONE)  # killed once, retried, finished
    record(redis, store, ids["failed_in_eval"], JobStatus.FAILED, {"stage": "eval", "type": "RuntimeError"})
    record(redis, store, ids["cancelled"], JobStatus.CANCELLED)
    entries = {f"{job_id}-rollout": 1.0 for job_id in ids.values()}
    entries["not-one-of-ours"] = 1.0  # a forged rq job
    redis.zadd(queue.failed_job_registry.key, entries)

    removed = prune_failed_registry(queue, store)

    left = [m.decode() for m in redis.zrange(queue.failed_job_registry.key, 0, -1)]
    assert left == [f"{ids['failed_here']}-rollout"]
    assert removed == 5
    assert prune_failed_registry(queue, store) == 0  # nothing more to do
