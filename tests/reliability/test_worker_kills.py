"""SIGKILL workers of every stage, 20 times across a 200-job run: every job ends, none twice."""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections import Counter

from redis import Redis

from shared.config import STAGES
from tests.reliability.jobs import scripted_jobs, statuses, submit, wait_all_terminal
from tests.support.waiting import client_for, job, trace

JOBS = 200
KILLS = 20
SLEEP = {"init": 0.2, "rollout": 0.5, "eval": 0.2}


def test_twenty_worker_kills_in_a_200_job_run_lose_nothing_and_finish_nothing_twice(make_stack, trace_dir, figure):
    # Retries above the kills a job could meet, so a job hit repeatedly is re-run, not failed as lost.
    stack = make_stack(concurrency={"init": 3, "rollout": 6, "eval": 3}, env={"ROLLOUTS_STAGE_RETRIES": "25"})
    for stage in STAGES:
        stack.start_worker(stage)  # two per stage: one keeps working while the other is killed
    stack.wait_for_workers()
    api = client_for(stack)

    started = time.monotonic()
    ids = submit(api, scripted_jobs(JOBS, trace_dir, SLEEP))
    killed: Counter[str] = Counter()
    for i in range(KILLS):
        stage = STAGES[i % len(STAGES)]
        victim = stack.workers[stage][-2]  # the older of the stage's two live workers
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        stack.workers[stage].remove(victim)
        stack.start_worker(stage)
        killed[stage] += 1
        time.sleep(1.0)
    try:
        final = wait_all_terminal(api, ids, timeout=240)
    except AssertionError as stuck:
        raise AssertionError(f"{stuck}; {_diagnosis(stack, api, ids)}") from None
    elapsed = time.monotonic() - started

    assert len(set(ids)) == JOBS and len(final) == JOBS
    records = [job(api, job_id) for job_id in ids]
    bad = [(r["id"], r["status"], r.get("error")) for r in records if r["status"] != "done"]
    assert not bad, f"{len(bad)} jobs did not finish: {bad[:5]}"
    for record in records:
        lines = trace(trace_dir, record["id"])
        ends = [line for line in lines if line.startswith("eval end")]
        # A stage may re-run after a kill (at least once), but each attempt finishes at most once
        # and the record is moved to done exactly once (the fencing token refuses the rest).
        assert len(ends) == len(set(ends)) <= record["attempts"]["eval"], (record["id"], lines)
    lost = Counter()
    for record in records:
        lost.update(record.get("lost") or {})
    latencies = [r["timings"]["eval"]["ended"] - r["timings"]["init"]["queued"] for r in records]
    figure(
        f"{JOBS} jobs, {sum(killed.values())} SIGKILLs ({dict(killed)}): all done, none twice; "
        f"stage re-runs after a kill {dict(lost)}; run {elapsed:.0f} s; "
        f"job latency median {statistics.median(latencies):.1f} s, max {max(latencies):.1f} s"
    )


def _diagnosis(stack, api, ids: list[str]) -> str:  # type: ignore[no-untyped-def]
    """Where unfinished jobs are, and which rq maintenance locks are held (a killed holder keeps one for 899 s)."""
    waiting = Counter(s for s in statuses(api, ids).values() if s not in ("done", "failed"))
    redis = Redis.from_url(stack.redis_url)
    try:
        locks = {key.decode(): redis.ttl(key) for key in redis.scan_iter("rq:clean_registries:*")}
    finally:
        redis.close()
    return f"unfinished by status {dict(waiting)}; rq maintenance locks held (key: ttl s) {locks}"
