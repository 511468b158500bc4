"""rq's failed registry holds only jobs that really failed at that stage.

rq files an rq job there whenever it sees a failure: a worker killed mid-job (after the job was
retried and finished elsewhere), rq's own bookkeeping failing after the stage runner returned
(the record stands, done), a forged job. `GET /v1/status` counts the registry per stage, so each
such entry was a failure that did not happen. The job record is the truth: an entry whose record
did not fail at that stage (done, retried and running, cancelled, or gone) leaves the registry;
its rq job hash expires as rq's do (it may be the very rq job a retry runs again).
"""

from __future__ import annotations

import logging

from rq import Queue

from shared.codec import unpack
from shared.jobs.queues import is_stage_rq_job_id, parse_rq_job_id
from shared.jobs.status import JobStatus
from shared.jobs.store import JobStore

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
