"""The job store's atomic status moves, against a real redis-server."""

from __future__ import annotations

import threading

from redis import Redis

from shared.config import Settings
from shared.jobs.status import ALL_STATUSES
from shared.jobs.store import JobStore

SPEC = {"task": {"kind": "demo", "text": "x"}, "limits": {}, "sampling": {}}


def statuses_indexed(store: JobStore, job_id: str) -> list[str]:
    return [s for s in ALL_STATUSES if store.redis.zscore(store.keys.jobs_by_status(s), job_id) is not None]


def test_take_moves_the_job_into_the_stage_and_returns_the_record(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    (job,) = store.submit([SPEC])
    taken = store.take(job.job_id, "init", ("queued", "init"), "init.host.1.0")
    assert taken.applied and taken.previous == "queued" and taken.attempt == 1
    assert taken.record["status"] == "init" and taken.record["spec"] == SPEC
    assert "started" in taken.record["timings"]["init"]
    assert statuses_indexed(store, job.job_id) == ["init"]
    refused = store.take(job.job_id, "eval", ("rollout", "eval"), "eval.host.1.0")
    assert not refused.applied and refused.previous == "init" and refused.record is None
    assert store.take("nope", "init", ("queued",), "w").previous == ""


def test_a_move_from_the_wrong_status_is_refused(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    (job,) = store.submit([SPEC])
    refused = store.transition(job.job_id, ("rollout",), "eval")
    assert not refused.applied and refused.previous == "queued"
    assert store.transition("no-such-job", "*", "failed").previous == ""
    assert not redis.exists(store.keys.job("no-such-job")), "a refused move must not create a record"


def test_cancel_racing_a_stage_hand_over_has_exactly_one_winner(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    ids = [s.job_id for s in store.submit([SPEC] * 200)]
    for job_id in ids:
        store.transition(job_id, ("queued",), "init")
    outcomes: dict[str, list[str]] = {job_id: [] for job_id in ids}
    barrier = threading.Barrier(2)

    def hand_over() -> None:
        barrier.wait()
        for job_id in ids:
            if store.transition(job_id, ("init",), "rollout").applied:
                outcomes[job_id].append("rollout")

    def cancel() -> None:
        barrier.wait()
        for job_id in reversed(ids):
            if store.cancel(job_id).applied:
                outcomes[job_id].append("cancel")

    threads = [threading.Thread(target=hand_over), threading.Thread(target=cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    for job_id in ids:
        # Both may apply, but only as a cancel of the rollout: a hand-over after a cancel would
        # leave the job in rollout with the cancel applied. (The lists' order is the threads',
        # not Redis's.) The record and its index agree.
        status = store.status(job_id)
        applied = sorted(outcomes[job_id])
        if status == "rollout":
            assert applied == ["rollout"]
        else:
            assert status == "cancelled" and applied in (["cancel"], ["cancel", "rollout"]), applied
        assert statuses_indexed(store, job_id) == [status]


def test_a_superseded_attempt_cannot_move_the_job(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    (job,) = store.submit([SPEC])
    first = store.take(job.job_id, "init", ("queued", "init"), "w1")
    second = store.take(job.job_id, "init", ("queued", "init"), "w2")
    assert (first.attempt, second.attempt) == (1, 2)
    assert second.record["workers"] == {"init": "w2"} and second.record["attempts"] == {"init": 2}
    first, second = first.attempt, second.attempt
    stale = store.transition(job.job_id, ("init",), "rollout", guard=("attempts:init", first))
    assert not stale.applied and stale.previous == "superseded"
    assert store.transition(job.job_id, ("init",), "rollout", guard=("attempts:init", second)).applied


def test_terminal_records_expire_and_their_index_entries_are_trimmed(redis: Redis, settings: Settings):
    store = JobStore(redis, settings.model_copy(update={"job_ttl_s": 100}))
    (job,) = store.submit([SPEC])
    store.transition(job.job_id, "*", "failed", {"error": {"type": "x"}})
    assert 0 < redis.ttl(store.keys.job(job.job_id)) <= 100
    assert store.get(job.job_id)["error"] == {"type": "x"}
    redis.zadd(store.keys.jobs_by_status("failed"), {job.job_id: 1.0})  # as if it finished long ago
    redis.delete(store.keys.job(job.job_id))
    assert store.trim_indexes() >= 1
    assert statuses_indexed(store, job.job_id) == []


def test_status_changes_are_published_for_watchers(redis: Redis, settings: Settings):
    store = JobStore(redis, settings)
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.keys.job_events)
    (job,) = store.submit([SPEC])
    store.cancel(job.job_id)
    message = None
    for _ in range(50):
        message = pubsub.get_message(timeout=0.1)
        if message:
            break
    assert message and message["data"] == f"{job.job_id} cancelled".encode()
    pubsub.close()
