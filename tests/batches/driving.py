"""Move a batch's jobs to terminal statuses by hand (no workers) and run the hook, as a worker would."""

from __future__ import annotations

from shared.batches.replenish import record_job
from shared.batches.store import BatchStore

TERMINAL = ("done", "failed", "cancelled", "timed_out")


def finish_job(batches: BatchStore, job_id: str, status: str = "done", reward: float | None = None) -> None:
    if status == "done":  # as the eval stage's runner records it: the evaluation stored, the reward inline
        fields = {**batches.jobs.store_part(job_id, "eval", {"reward": reward}), "reward": reward}
    else:
        fields = {"error": {"type": "boom", "message": "x"}}
    assert batches.jobs.transition(job_id, "*", status, fields).applied
    record_job(batches, job_id)


def finish_group(batches: BatchStore, batch_id: str, k: int, status: str = "done") -> None:
    """Every live job of group k ends; a done job's reward is its task's `rewards[sample index]`."""
    for job_id in batches.group_job_ids(batch_id, k):
        record = batches.jobs.get(job_id)
        assert record is not None
        if record["status"] not in TERMINAL:
            rewards = record["spec"]["task"]["rewards"]
            finish_job(batches, job_id, status, rewards[record["sample_index"] % len(rewards)])
