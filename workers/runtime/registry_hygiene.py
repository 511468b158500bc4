"""rq's registries tell the truth: failed holds only jobs that really failed at that stage, and no
job is stranded between a queue and a worker.

rq files an rq job there whenever it sees a failure: a worker killed mid-job (after the job was
retried and finished elsewhere), rq's own bookkeeping failing after the stage runner returned
(the record stands, done), a forged job. `GET /v1/status` counts the registry per stage, so each
such entry was a failure that did not happen. The job record is the truth: an entry whose record
did not fail at that stage (done, retried and running, cancelled, or gone) leaves the registry;
its rq job hash expires as rq's do (it may be the very rq job a retry runs again).
"""

from __future__ import annotations

import logging
import time

from rq import Queue

from shared.codec import unpack
from shared.jobs.queues import is_stage_rq_job_id, parse_rq_job_id
from shared.jobs.status import JobStatus
from shared.jobs.store import JobStore
from shared.lua_scripts import register_lua

log = logging.getLogger("rollouts.worker")

BATCH = 500  # entries looked at per queue per maintenance pass, so a long registry never stalls it


def prune_failed_registry(queue: Queue, store: JobStore, batch: int = BATCH) -> int:
    """Remove the failed-registry entries of `queue` that no job record backs; returns how many."""
    registry = queue.failed_job_registry
    rq_ids = [member.decode() for member in queue.connection.zrange(registry.key, 0, batch - 1)]
    if not rq_ids:
        return 0
    ours = [rq_id for rq_id in rq_ids if is_stage_rq_job_id(rq_id)]
    with store.redis.pipeline(transaction=False) as pipe:
        for rq_id in ours:
            pipe.hmget(store.keys.job(parse_rq_job_id(rq_id)[0]), ("status", "error"))
        records = dict(zip(ours, pipe.execute()))
    stale = [rq_id for rq_id in rq_ids if not _failed_here(rq_id, records.get(rq_id))]
    for rq_id in stale:
        registry.remove(rq_id)
    if stale:
        log.info("queue %s: %d failed-registry entries whose job did not fail there removed", queue.name, len(stale))
    return len(stale)


def _failed_here(rq_id: str, record: list[bytes | None] | None) -> bool:
    if record is None:  # not an id this service made
        return False
    status, error = record
    if status is None or status.decode() != JobStatus.FAILED:
        return False
    stage = parse_rq_job_id(rq_id)[1]
    return (unpack(error) or {}).get("stage") == stage if error else False


def requeue_stranded(queue: Queue, grace_s: float, batch: int = BATCH) -> int:
    """Put back on `queue` the jobs a worker took and never started; returns how many.

    rq takes a job by moving its id to the queue's intermediate list, then starts it (started
    registry) and drops it from that list in one transaction. A worker whose Redis connection broke
    between the two (a Redis restart) leaves the id there, neither queued nor running. rq's own
    `IntermediateQueue.cleanup` recovers it only after a minute, through `handle_job_failure` on the
    worker it is given: that spends one of the job's retries, and on one of this process's slots it
    clears the slot's own running execution. Here an id found there for `grace_s` (a worker's
    heartbeat TTL: a live worker starts what it took within milliseconds) goes back to the head of
    its queue as it was, retries untouched.
    """
    intermediate = queue.intermediate_queue
    redis = queue.connection
    requeue = register_lua(redis, __package__, "requeue_if_stranded.lua")
    stranded = 0
    for job_id in intermediate.get_job_ids()[:batch]:
        if job_id in queue.started_job_registry:
            continue
        seen_key = intermediate.get_first_seen_key(job_id)
        # Short-lived, unlike rq's day-long mark: a mark left by a job started since must not
        # make the same rq job id (a stage's retry) look stranded at once the next time.
        if redis.set(seen_key, time.time(), nx=True, ex=max(60, int(4 * grace_s))):
            continue
        first_seen = intermediate.get_first_seen(job_id)
        if first_seen is None or time.time() - first_seen.timestamp() < grace_s:
            continue
        if queue.fetch_job(job_id) is None:
            intermediate.remove(job_id)  # its rq job expired or was deleted: nothing to run
        # Back on the queue's head only if it is still in the intermediate list: a worker that took it
        # meanwhile removed it there (in the same transaction that started it), and then nothing moves.
        elif requeue(keys=[intermediate.key, queue.key], args=[job_id]):
            stranded += 1
        redis.delete(seen_key)
    if stranded:
        log.warning("queue %s: %d jobs taken by a worker that never started them queued again", queue.name, stranded)
    return stranded
