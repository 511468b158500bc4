"""Repair what a crash left half done; run from the worker supervisors' maintenance.

Every step is idempotent, so overlapping sweeps or a sweep racing a job end
change nothing twice: groups reserved but never submitted are submitted (same
idempotency keys), terminal jobs whose job end never ran are recorded (a sample
counts once), and a closed batch's groups that still run are cancelled.
"""

from __future__ import annotations

import logging
import time

from shared.batches.replenish import batch_store, cancel_groups, launch, record_job
from shared.batches.status import BatchStatus
from shared.batches.store import BatchStore, closes_groups
from shared.jobs.status import TERMINAL
from shared.jobs.store import JobStore

log = logging.getLogger("rollouts.batches")

# A reservation younger than this is most likely being submitted right now by the process that made it.
LAUNCH_GRACE_S = 10.0


def sweep(batches: BatchStore, launch_grace_s: float = LAUNCH_GRACE_S) -> dict[str, int]:
    """One pass over the live batches; returns what it repaired (for logs and tests)."""
    repaired = {"launched": 0, "recorded": 0, "cancelled": 0}
    batches.redis.zremrangebyscore(batches.keys.batches, "-inf", time.time() - batches.ttl)
    for raw in batches.redis.smembers(batches.keys.live):
        batch_id = raw.decode()
        try:
            _sweep_batch(batches, batch_id, launch_grace_s, repaired)
        except Exception:  # one broken batch must not stop the repair of the others
            log.exception("batch sweep failed for batch %s", batch_id)
    return repaired


def _sweep_batch(batches: BatchStore, batch_id: str, launch_grace_s: float, repaired: dict[str, int]) -> None:
    head = batches.head(batch_id)
    if head is None:
        batches.redis.srem(batches.keys.live, batch_id)
        return
    stale = batches.redis.zrangebyscore(batches.keys.launching(batch_id), "-inf", time.time() - launch_grace_s)
    if stale:
        launch(batches, batch_id, [int(k) for k in stale])
        repaired["launched"] += len(stale)
    if head["status"] == BatchStatus.RUNNING:
        launch(batches, batch_id, batches.fill(batch_id))
    for k in batches.in_flight_groups(batch_id):
        repaired["recorded"] += _record_missed(batches, batch_id, k)
    head = batches.head(batch_id) or head
    if closes_groups(head):
        repaired["cancelled"] += cancel_groups(batches, batch_id, batches.in_flight_groups(batch_id))
    if head["status"] != BatchStatus.RUNNING and not batches.in_flight_groups(batch_id):
        batches.redis.srem(batches.keys.live, batch_id)


def _record_missed(batches: BatchStore, batch_id: str, k: int) -> int:
    job_ids = batches.group_job_ids(batch_id, k)
    seen = {s.get("job_id") for s in batches.group(batch_id, k)["samples"].values()}
    missed = [
        job_id
        for job_id, status in zip(job_ids, batches.jobs.statuses(job_ids))
        if status in TERMINAL and job_id not in seen
    ]
    return sum(1 for job_id in missed if (r := record_job(batches, job_id)) is not None and r.recorded)


def sweep_once(batches: BatchStore, interval_s: float) -> dict[str, int] | None:
    """Sweep unless another process did within `interval_s` (one sweeper per interval fleet-wide)."""
    if not batches.redis.set(batches.keys.sweep_lock, "1", nx=True, ex=max(1, int(interval_s))):
        return None
    return sweep(batches)


def sweep_batches(jobs: JobStore, interval_s: float) -> None:
    """The maintenance entry point: never raises (a failed sweep is retried next interval)."""
    try:
        repaired = sweep_once(batch_store(jobs), interval_s)
    except Exception:
        log.exception("batch sweep failed")
        return
    if repaired and any(repaired.values()):
        log.warning("batch sweep repaired %s", repaired)
