"""The event-driven half of dynamic sampling: called wherever a job reaches a terminal status.

Whoever moves a job to a terminal status calls `batch_job_ended`, through
shared/job_end.py's `job_ended`: the stage runner (done, failed, timed_out)
and rq's failure callback (worker lost for good), via the workers' job end
(workers/runtime/job_end.py), and the jobs API's cancel; a batch's own cancels record their jobs
directly (`cancel_groups`). For a job of a batch group
it records the sample; when that completes the group, the Lua script has
already decided the outcome and reserved the next prompts, and this side
submits their jobs at once (asynchronous replenishment) or, when the batch
just closed with on_target=cancel, cancels the groups still running.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from shared.batches.spec import BatchRequest, idempotency_key, parse_group_id
from shared.batches.staleness import STALE, is_stale
from shared.batches.store import BatchStore, Recorded, closes_groups
from shared.codec import unpack
from shared.jobs.record_fields import output_field
from shared.jobs.status import TERMINAL, JobStatus
from shared.jobs.store import JobStore, reward_of
from shared.run_stats.record import record_job_end

log = logging.getLogger("rollouts.batches")
_stores: weakref.WeakKeyDictionary[JobStore, BatchStore] = weakref.WeakKeyDictionary()


def batch_store(jobs: JobStore) -> BatchStore:
    """One BatchStore per JobStore (its Lua scripts are registered once per process)."""
    store = _stores.get(jobs)
    if store is None:
        store = _stores[jobs] = BatchStore(jobs)
    return store


def start_batch(batches: BatchStore, request: BatchRequest, prompts: list[dict[str, Any]]) -> str:
    """Store a new batch, reserve its first groups and submit their jobs."""
    batch_id = batches.create(request, prompts)
    launch(batches, batch_id, batches.fill(batch_id))
    return batch_id


class Unknown:
    """The type of UNKNOWN: "the caller did not say", as opposed to "no group" (None)."""


UNKNOWN = Unknown()


def launch(batches: BatchStore, batch_id: str, prompt_indices: list[int]) -> None:
    """Submit reserved groups, then re-read the status: a batch that closed meanwhile could not
    see these jobs to cancel them, so this side does (see docs/BATCHES.md, races)."""
    if not prompt_indices:
        return
    batches.submit_groups(batch_id, prompt_indices)
    head = batches.head(batch_id)
    if head is not None and closes_groups(head):
        cancel_groups(batches, batch_id, prompt_indices)


def batch_job_ended(jobs: JobStore, job_id: str, group_id: str | Unknown | None = UNKNOWN) -> None:
    """Never raises: a terminal move must not fail because of a batch; the sweep repairs a miss.

    A caller that knows the job's group id passes it, so the common case (no batch) costs no read.
    """
    if group_id is not UNKNOWN and parse_group_id(group_id) is None:  # type: ignore[arg-type]
        return
    try:
        record_job(batch_store(jobs), job_id)
    except Exception:
        log.exception("job %s: recording its batch group failed; the batch sweep will retry", job_id)


def record_job(batches: BatchStore, job_id: str) -> Recorded | None:
    """Record a terminal job of a batch group and act on what that decided; None for other jobs."""
    fields = ("group_id", "sample_index", "status", "reward", output_field("eval"), "error")
    group_raw, sample_raw, status_raw, reward_raw, evaluation_raw, error_raw = batches.redis.hmget(
        batches.jobs.keys.job(job_id), fields
    )
    parsed = parse_group_id(group_raw.decode() if group_raw else None)
    status = status_raw.decode() if status_raw else ""
    if parsed is None or status not in TERMINAL or sample_raw is None:
        return None
    batch_id, k = parsed
    sample = int(sample_raw)
    # Only the job the batch itself submitted for this slot counts: anyone can submit a job
    # with a batch-shaped group id through /v1/jobs, but not under the batch's idempotency key.
    holder = batches.redis.get(batches.jobs.keys.idempotency(idempotency_key(batch_id, k, sample)))
    if holder is None or holder.decode() != job_id:
        log.warning("job %s claims group %s but is not the batch's job for sample %d; ignored", job_id, k, sample)
        return None
    reward = None
    if status == JobStatus.DONE:
        reward = reward_of(reward_raw, evaluation_raw)
        max_staleness = _max_staleness(batches, batch_id)
        if max_staleness is not None and is_stale(batches.jobs, job_id, max_staleness):
            status, reward = STALE, None
    error = unpack(error_raw) if error_raw else None
    message = f"{error.get('type', 'error')}: {error.get('message', '')}" if isinstance(error, dict) else ""
    if status != JobStatus.DONE and not message:
        message = status
    recorded = batches.record(batch_id, k, sample, job_id, status, reward, message)
    if recorded.group_complete:
        launch(batches, batch_id, list(recorded.reserved))
        if recorded.closed_batch:
            head = batches.head(batch_id)
            if head is not None and closes_groups(head):
                cancel_groups(batches, batch_id, batches.in_flight_groups(batch_id))
    return recorded


def _max_staleness(batches: BatchStore, batch_id: str) -> int | None:
    head = batches.head(batch_id)
    return None if head is None else (head.get("request") or {}).get("max_staleness")


def cancel_groups(batches: BatchStore, batch_id: str, prompt_indices: list[int]) -> int:
    """Cancel every live job of these groups and record each; returns how many were cancelled."""
    cancelled = 0
    for k in prompt_indices:
        for job_id in batches.group_job_ids(batch_id, k):
            if batches.jobs.cancel(job_id).applied:
                cancelled += 1
                record_job(batches, job_id)
                record_job_end(batches.jobs, job_id)  # the run page counts it, as job_ended would
    return cancelled
