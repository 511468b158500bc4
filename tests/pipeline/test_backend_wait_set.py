"""The waiting set of jobs that found no LLM backend, against a real redis-server: park, look again,
wake on a backend that opens, expire after backend_wait_s, and skip what was cancelled meanwhile."""

from __future__ import annotations

import time

from redis import Redis
from rq import Queue

from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.jobs.backend_wait import FIRST_RETRY_S, is_waiting, park, plan_wait, release_due
from shared.jobs.store import JobStore

SPEC = {"task": {"kind": "demo", "text": "x"}, "limits": {"rollout_timeout_s": 50}, "sampling": {}}


def in_rollout(store: JobStore) -> tuple[str, int]:
    """A job taken into the rollout stage: (its id, the attempt's number)."""
    (job,) = store.submit([SPEC])
    taken = store.take(job.job_id, "rollout", ("queued", "rollout"), "rollout.host.1.0")
    assert taken.applied
    return job.job_id, taken.attempt


def wait(store: JobStore, job_id: str, attempt: int, now: float) -> float:
    """Hand the attempt back to wait, as the stage runner does; returns when it looks again."""
    plan = plan_wait(store, job_id, "rollout", attempt, now)
    assert not plan.expired
    assert park(store, job_id, "rollout", attempt, plan) is None
    return plan.due


def rollout_queue(redis: Redis) -> list[str]:
    return Queue("rollout", connection=redis).job_ids


def test_a_parked_job_waits_then_is_queued_again_under_an_rq_id_of_its_own(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    job_id, attempt = in_rollout(store)
    now = time.time()
    due = wait(store, job_id, attempt, now)
    assert due == now + FIRST_RETRY_S
    record = store.get(job_id)
    assert record is not None and is_waiting(record) and record["timings"]["rollout"]["waiting"] == now

    assert release_due(store, settings, now=due - 0.5) == 0, "not before its time"
    assert release_due(store, settings, now=due) == 1
    assert rollout_queue(redis) == [f"{job_id}-rollout-h{attempt}"]
    assert release_due(store, settings, now=due) == 0, "released once"
    job = Queue("rollout", connection=redis).fetch_job(f"{job_id}-rollout-h{attempt}")
    assert job is not None and job.timeout == 50 + 30, "the job's own limit sets rq's backstop"

    taken = store.take(job_id, "rollout", ("rollout",), "rollout.host.1.1")  # the next look takes it
    record = store.get(job_id)
    assert record is not None and not is_waiting(record) and taken.attempt == attempt + 1


def test_the_wait_spans_consecutive_looks_and_expires_after_backend_wait_s(redis: Redis, settings: Settings):
    settings = settings.model_copy(update={"backend_wait_s": 100.0, "backend_wait_retry_s": 30.0})
    store = JobStore(redis, settings)
    job_id, attempt = in_rollout(store)
    since = time.time()
    wait(store, job_id, attempt, since)
    taken = store.take(job_id, "rollout", ("rollout",), "w")
    plan = plan_wait(store, job_id, "rollout", taken.attempt, since + 40)
    assert plan.since == since and plan.waited_s == 40 and not plan.expired
    assert plan.due == since + 40 + 20, "half the time waited so far"
    assert plan_wait(store, job_id, "rollout", taken.attempt, since + 90).due == since + 100, "never past the wait"
    assert plan_wait(store, job_id, "rollout", taken.attempt, since + 100).expired
    # An attempt after one that ran (it did not wait) starts a new wait.
    later = plan_wait(store, job_id, "rollout", taken.attempt + 1, since + 500)
    assert later.since == since + 500 and not later.expired


def test_a_backend_that_opens_wakes_every_waiting_job(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    pool = BackendPool(redis, store.keys, settings)
    first, second = in_rollout(store), in_rollout(store)
    now = time.time()
    for job_id, attempt in (first, second):
        wait(store, job_id, attempt, now)
        redis.zadd(store.keys.llm_waiting, {f"{job_id}-rollout": now + 1000})  # long past any test
    assert release_due(store, settings, now=now) == 0

    pool.register("http://127.0.0.1:9", "m")
    assert release_due(store, settings, now=now) == 2
    assert sorted(rollout_queue(redis)) == sorted(f"{j}-rollout-h{a}" for j, a in (first, second))


def test_only_a_backend_open_to_new_pins_wakes_them(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    pool = BackendPool(redis, store.keys, settings)
    backend = pool.register("http://127.0.0.1:9", "m")
    pool.drain(backend.id)
    job_id, attempt = in_rollout(store)
    now = time.time()
    wait(store, job_id, attempt, now)
    redis.zadd(store.keys.llm_waiting, {f"{job_id}-rollout": now + 1000})

    pool.register("http://127.0.0.1:9", "m")  # a restarted launcher: the operator's drain stays
    pool.set_health(backend.id, True)
    assert release_due(store, settings, now=now) == 0
    pool.drain(backend.id, draining=False)
    assert release_due(store, settings, now=now) == 1


def test_a_job_cancelled_while_it_waits_is_still_queued_for_a_worker_to_skip_and_tidy(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    job_id, attempt = in_rollout(store)
    due = wait(store, job_id, attempt, time.time())
    assert store.cancel(job_id).applied
    assert release_due(store, settings, now=due) == 1
    assert rollout_queue(redis) == [f"{job_id}-rollout-h{attempt}"] and redis.zcard(store.keys.llm_waiting) == 0


def test_an_attempt_that_no_longer_owns_the_job_does_not_park_it(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    job_id, attempt = in_rollout(store)
    plan = plan_wait(store, job_id, "rollout", attempt, time.time())
    store.take(job_id, "rollout", ("rollout",), "a newer worker")  # a newer attempt owns the job
    assert park(store, job_id, "rollout", attempt, plan) == "superseded"
    store.cancel(job_id)
    assert park(store, job_id, "rollout", attempt + 1, plan) == "cancelled"
    assert park(store, "no-such-job", "rollout", 1, plan) == ""
    record = store.get(job_id)
    assert record is not None and not is_waiting(record) and record["wait"] == {}
    assert redis.zcard(store.keys.llm_waiting) == 0, "no entry that could start an attempt"


def test_a_job_whose_record_is_gone_or_unreadable_does_not_block_the_others(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    (gone, gone_attempt), (odd, odd_attempt), (fine, fine_attempt) = (in_rollout(store) for _ in range(3))
    now = time.time()
    for job_id, attempt in ((gone, gone_attempt), (odd, odd_attempt), (fine, fine_attempt)):
        wait(store, job_id, attempt, now)
    redis.delete(store.keys.job(gone))
    redis.hset(store.keys.job(odd), "spec", b"\xc1")  # not msgpack
    assert release_due(store, settings, now=now + 1) == 3
    assert sorted(rollout_queue(redis)) == sorted(
        [f"{gone}-rollout-h0", f"{odd}-rollout-h{odd_attempt}", f"{fine}-rollout-h{fine_attempt}"]
    )
