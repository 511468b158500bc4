"""The failed registry that /v1/status counts holds only jobs whose records failed at that stage, and
a job a worker took but never started goes back to its queue."""

from __future__ import annotations

import time

from redis import Redis

from shared.codec import pack
from shared.config import Settings
from shared.jobs.queues import enqueue_stage, rq_job_id, stage_queue
from shared.jobs.spec import Limits
from shared.jobs.status import JobStatus
from shared.jobs.store import JobStore
from workers.runtime.registry_hygiene import prune_failed_registry, requeue_stranded


def record(redis: Redis, store: JobStore, job_id: str, status: str, error: dict | None = None) -> None:
    redis.hset(store.keys.job(job_id), mapping={"status": status, **({"error": pack(error)} if error else {})})


def test_only_entries_backed_by_a_failed_record_at_that_stage_stay(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    queue = stage_queue("rollout", redis)
    ids = {
        name: f"{n:032x}" for n, name in enumerate(["failed_here", "done", "failed_in_eval", "gone", "cancelled"], 1)
    }
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


def test_a_job_taken_and_never_started_goes_back_to_the_head_of_its_queue(redis: Redis, settings: Settings):
    queue = stage_queue("rollout", redis)
    stranded, running, waiting = (f"{n:032x}" for n in (1, 2, 3))
    with redis.pipeline(transaction=True) as pipe:
        enqueue_stage(pipe, "rollout", [(job_id, Limits()) for job_id in (stranded, running, waiting)], settings, redis)
        pipe.execute()
    intermediate = queue.intermediate_queue
    for _ in range(2):  # taken as rq's workers take jobs: moved to the intermediate list
        redis.lmove(queue.key, intermediate.key)
    redis.zadd(queue.started_job_registry.key, {f"{rq_job_id(running, 'rollout')}:execution": time.time() + 600})
    redis.rpush(intermediate.key, "f" * 32 + "-rollout")  # a leftover whose rq job is gone

    assert requeue_stranded(queue, grace_s=30) == 0  # first sight: marked, left alone
    assert requeue_stranded(queue, grace_s=30) == 0  # within the grace: a live worker may be starting it
    redis.set(intermediate.get_first_seen_key(rq_job_id(stranded, "rollout")), time.time() - 31)
    redis.set(intermediate.get_first_seen_key("f" * 32 + "-rollout"), time.time() - 31)

    assert requeue_stranded(queue, grace_s=30) == 1
    assert queue.get_job_ids() == [rq_job_id(stranded, "rollout"), rq_job_id(waiting, "rollout")]
    assert intermediate.get_job_ids() == [rq_job_id(running, "rollout")]  # a started job is never moved
    job = queue.fetch_job(rq_job_id(stranded, "rollout"))
    assert job is not None and job.retries_left == settings.stage_retries  # no retry spent, unlike rq's cleanup
    assert requeue_stranded(queue, grace_s=30) == 0
