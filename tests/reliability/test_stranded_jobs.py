"""A job a worker took but never started (its connection broke between the two, as in a Redis
restart) runs again soon, once, with no retry spent, and the slots around it are left alone."""

from __future__ import annotations

import time
from pathlib import Path

from redis import Redis

from shared.jobs.queues import rq_job_id, stage_queue
from tests.reliability.jobs import submit
from tests.support.holds import Gate
from tests.support.waiting import client_for, job, trace, wait_for, wait_status


def test_a_job_stranded_between_queue_and_worker_runs_once_without_spending_a_retry(
    make_stack, trace_dir, figure, tmp_path
):
    stack = make_stack(concurrency={"init": 1, "rollout": 1, "eval": 1})
    api = client_for(stack)
    redis = Redis.from_url(stack.redis_url)
    queue = stage_queue("rollout", redis)
    sleep = {"kind": "scripted", "trace": str(trace_dir)}
    gate = Gate(tmp_path / "release-busy")  # the busy job holds the only rollout slot until the strand is made
    busy = submit(api, [{"task": {**sleep, **gate.hold("rollout")}}])[0]
    wait_for(lambda: "rollout start attempt=1" in " ".join(trace(trace_dir, busy)), what="the busy rollout")
    stranded = submit(api, [{"task": {**sleep, "sleep": {}}}])[0]
    rq_id = rq_job_id(stranded, "rollout")
    wait_for(lambda: rq_id in queue.get_job_ids(), what="the second job queued behind the busy slot")

    # What a worker that lost Redis right after taking the job leaves behind, seen a while ago.
    # The busy job keeps the only slot until the requeued rq job is read: run, it would be gone (result_ttl=0).
    try:
        assert redis.lmove(queue.key, queue.intermediate_queue.key).decode() == rq_id
        redis.set(queue.intermediate_queue.get_first_seen_key(rq_id), time.time() - 3600)
        moved = time.monotonic()
        wait_for(lambda: rq_id in queue.get_job_ids(), what="the job queued again")
        back_after = time.monotonic() - moved
        rq_job = queue.fetch_job(rq_id)
        assert rq_job is not None and rq_job.retries_left == stack.settings.stage_retries, "a retry was spent"
    finally:
        gate.release()

    for job_id in (busy, stranded):
        assert wait_status(api, job_id, {"done", "failed", "cancelled", "timed_out"})["status"] == "done"
        record = job(api, job_id)
        assert not record.get("lost"), record
        rollouts = _rollouts(trace_dir, job_id)
        assert len(rollouts) == 1 and "attempt=1" in rollouts[0], rollouts  # the busy slot was not disturbed
    figure(
        f"a job stranded in rq's intermediate list queued again {back_after:.1f} s after its mark came due; "
        "ran once, no retry spent"
    )


def _rollouts(trace_dir: Path, job_id: str) -> list[str]:
    return [line for line in trace(trace_dir, job_id) if line.startswith("rollout start")]
