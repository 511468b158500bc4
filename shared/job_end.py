"""What any process does once it has moved a job to a terminal status: the part that needs only Redis.

The mover (the API's cancel route, a stage worker, rq's failure callback) calls `job_ended` right
after its move applied: the job's LLM backend pin goes, its batch group records it and the run
page's aggregates count it. The job's
workspace is on the workers' storage; workers/runtime/job_end.py removes it, and calls this.
"""

from __future__ import annotations

import logging
import weakref

from shared.backend_pool import BackendPool
from shared.batches.replenish import UNKNOWN, Unknown, batch_job_ended
from shared.jobs.store import JobStore
from shared.run_stats.record import record_job_end

log = logging.getLogger("rollouts.jobs")
_pools: weakref.WeakKeyDictionary[JobStore, BackendPool] = weakref.WeakKeyDictionary()


def job_ended(store: JobStore, job_id: str, group_id: str | Unknown | None = UNKNOWN) -> None:
    """Never raises: the move already happened; the lease reaper and the batch sweep repair a miss.

    A caller that knows the job's group id passes it, so a job of no batch costs no batch read.
    """
    release_pin(store, job_id)
    batch_job_ended(store, job_id, group_id)
    record_job_end(store, job_id)


def release_pin(store: JobStore, job_id: str) -> None:
    """Uncharge the job's LLM backend and drop its share of the pin; idempotent, never raises.

    The rollout releases its pin when it returns; this covers a rollout that never got there
    (its worker died, or it was cancelled while a generation was in flight).
    """
    pool = _pools.get(store)
    if pool is None:
        pool = _pools[store] = BackendPool(store.redis, store.keys, store.settings)
    try:
        pool.release(job_id)
    except Exception:
        log.exception("job %s: releasing its backend pin failed; its lease expires instead", job_id)
