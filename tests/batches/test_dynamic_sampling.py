"""DAPO bookkeeping against a real redis-server, jobs moved by hand (no workers): exact counts,
replacement of filtered groups, failures, pool exhaustion, target actions and crash repair."""

from __future__ import annotations

import pytest
from redis import Redis

from shared.batches.replenish import batch_store, launch, record_job, start_batch
from shared.batches.spec import BatchRequest, parse_group_id
from shared.batches.store import BatchStore
from shared.batches.sweep import sweep
from shared.config import Settings
from shared.jobs.store import JobStore
from tests.batches.driving import finish_group, finish_job

INFORMATIVE = [0.0, 1.0, 1.0, 0.0]
UNIFORM = [1.0, 1.0, 1.0, 1.0]


@pytest.fixture()
def batches(redis: Redis, settings: Settings) -> BatchStore:
    return batch_store(JobStore(redis, settings))


def pool(pattern: list[list[float]]) -> list[dict]:
    return [{"task": {"kind": "sim", "rewards": rewards, "n": index}} for index, rewards in enumerate(pattern)]


def create(batches: BatchStore, prompts: list[dict], **options: object) -> str:
    request = BatchRequest(prompts=prompts, n_samples=4, **options)
    return start_batch(batches, request, prompts)


def test_uniform_groups_are_filtered_and_replaced_until_exactly_the_target(batches):
    prompts = pool([UNIFORM, INFORMATIVE] * 6)
    batch_id = create(batches, prompts, min_informative_groups=3, max_groups_in_flight=2)
    assert batches.in_flight_groups(batch_id) == [0, 1]
    assert len(batches.group_job_ids(batch_id, 0)) == 4
    finish_group(batches, batch_id, 0)  # uniform: filtered, prompt 2 launched at once
    assert batches.in_flight_groups(batch_id) == [1, 2]
    finish_group(batches, batch_id, 1)
    finish_group(batches, batch_id, 2)
    assert batches.in_flight_groups(batch_id) == [3, 4]
    finish_group(batches, batch_id, 4)
    finish_group(batches, batch_id, 3)
    assert batches.in_flight_groups(batch_id) == [5, 6]
    finish_group(batches, batch_id, 5)
    head = batches.head(batch_id)
    assert head["status"] == "completed" and head["used"] == 3 == head["informative"]
    assert head["uniform"] == 3 and head["launched"] == 7
    # the group still in flight at the target (prompt 6) was cancelled and counted late
    assert batches.in_flight_groups(batch_id) == []
    assert head["late"] == 1
    statuses = batches.jobs.statuses(batches.group_job_ids(batch_id, 6))
    assert statuses == ["cancelled"] * 4
    # the stream reports the informative groups once each, then ends
    entries = batches.redis.xrange(batches.keys.stream(batch_id))
    reported = [int(f[b"k"]) for _, f in entries if f[b"type"] == b"group"]
    assert reported == [1, 3, 5]
    assert entries[-1][1][b"type"] == b"end"
    assert not batches.redis.sismember(batches.keys.live, batch_id)


def test_keep_lets_running_groups_finish_as_late_without_reporting_them(batches):
    prompts = pool([INFORMATIVE] * 4)
    batch_id = create(batches, prompts, min_informative_groups=1, max_groups_in_flight=3, on_target="keep")
    finish_group(batches, batch_id, 1)
    assert batches.head(batch_id)["status"] == "completed"
    assert batches.jobs.statuses(batches.group_job_ids(batch_id, 0)) == ["queued"] * 4
    finish_group(batches, batch_id, 0)
    finish_group(batches, batch_id, 2)
    head = batches.head(batch_id)
    assert head["used"] == 1 and head["late"] == 2 and head["launched"] == 3
    assert len([e for e in batches.redis.xrange(batches.keys.stream(batch_id)) if e[1][b"type"] == b"group"]) == 1


def test_a_failed_sample_fails_its_group_which_is_reported_and_replaced(batches):
    batch_id = create(batches, pool([INFORMATIVE] * 3), min_informative_groups=2, max_groups_in_flight=1)
    first = batches.group_job_ids(batch_id, 0)
    finish_job(batches, first[0], "failed")
    for job_id in first[1:]:
        finish_job(batches, job_id, "done", 1.0)
    group = batches.group(batch_id, 0)
    assert group["outcome"] == "failed" and "boom" in group["error"]
    assert batches.in_flight_groups(batch_id) == [1]
    assert batches.redis.ttl(batches.keys.inflight(batch_id)) > 0  # emptied and re-created, still expires
    finish_group(batches, batch_id, 1)
    finish_group(batches, batch_id, 2)
    head = batches.head(batch_id)
    assert head["status"] == "completed" and head["failed"] == 1 and head["used"] == 2


def test_pool_running_out_before_the_target_ends_the_batch_exhausted(batches):
    batch_id = create(batches, pool([UNIFORM, INFORMATIVE, UNIFORM]), min_informative_groups=2, max_groups_in_flight=2)
    for k in (0, 1, 2):
        finish_group(batches, batch_id, k)
    head = batches.head(batch_id)
    assert head["status"] == "exhausted" and head["used"] == 1 and head["uniform"] == 2


def test_every_prompt_mode_reports_uniform_groups_too(batches):
    batch_id = create(batches, pool([UNIFORM, INFORMATIVE, UNIFORM]), max_groups_in_flight=2)
    for k in (0, 1, 2):
        finish_group(batches, batch_id, k)
    head = batches.head(batch_id)
    assert head["status"] == "completed" and head["used"] == 3 and head["uniform"] == 2
    assert head["target"] == 3


def test_a_job_recorded_twice_counts_once(batches):
    batch_id = create(batches, pool([INFORMATIVE] * 2), min_informative_groups=1, max_groups_in_flight=1)
    job_id = batches.group_job_ids(batch_id, 0)[0]
    finish_job(batches, job_id, "done", 0.0)
    assert record_job(batches, job_id).recorded is False
    assert batches.group(batch_id, 0)["recorded"] == 1


def test_sweep_submits_a_reservation_whose_launch_was_lost_and_records_missed_jobs(batches):
    batch_id = create(batches, pool([UNIFORM] * 3), min_informative_groups=1, max_groups_in_flight=1)
    # a crash right after the Lua script reserved prompt 1: the decision is in Redis, no jobs exist
    jobs = batches.group_job_ids(batch_id, 0)
    for job_id in jobs[:-1]:
        finish_job(batches, job_id, "done", 1.0)
    assert batches.jobs.transition(jobs[-1], "*", "done", {"reward": 1.0}).applied
    record = batches.record(batch_id, 0, 3, jobs[-1], "done", 1.0)  # the hook's Lua half only
    assert record.reserved == (1,)
    assert batches.group_job_ids(batch_id, 1) == []
    repaired = sweep(batches, launch_grace_s=0.0)
    assert repaired["launched"] == 1 and len(batches.group_job_ids(batch_id, 1)) == 4
    # a job that ended without its hook running (crash after the status move)
    job_id = batches.group_job_ids(batch_id, 1)[0]
    assert batches.jobs.transition(job_id, "*", "done", {"reward": 1.0}).applied
    assert sweep(batches, launch_grace_s=0.0)["recorded"] == 1
    assert batches.group(batch_id, 1)["recorded"] == 1
    # the sweep is idempotent: nothing more to do
    assert sweep(batches, launch_grace_s=0.0) == {"launched": 0, "recorded": 0, "cancelled": 0}


def test_resubmitting_a_group_maps_to_the_same_jobs(batches):
    batch_id = create(batches, pool([INFORMATIVE] * 2), min_informative_groups=1, max_groups_in_flight=1)
    before = batches.group_job_ids(batch_id, 0)
    launch(batches, batch_id, [0])
    assert batches.group_job_ids(batch_id, 0) == before


def test_group_ids_parse_back_to_batch_and_prompt():
    assert parse_group_id("b.abc123.17") == ("abc123", 17)
    assert parse_group_id("my-group") is None
    assert parse_group_id(None) is None


def test_one_batch_whose_launch_always_fails_does_not_stop_the_sweep(batches, monkeypatch):
    """Two batches lost a reservation each; relaunching the first always raises: the second is still repaired."""
    import shared.batches.sweep as sweep_module

    ids = []
    for _ in range(2):
        batch_id = create(batches, pool([UNIFORM] * 3), min_informative_groups=1, max_groups_in_flight=1)
        jobs = batches.group_job_ids(batch_id, 0)
        for job_id in jobs[:-1]:
            finish_job(batches, job_id, "done", 1.0)
        assert batches.jobs.transition(jobs[-1], "*", "done", {"reward": 1.0}).applied
        assert batches.record(batch_id, 0, 3, jobs[-1], "done", 1.0).reserved == (1,)  # launch lost
        ids.append(batch_id)
    broken, healthy = ids
    real_launch = sweep_module.launch

    def launch(store, batch_id, groups):  # type: ignore[no-untyped-def]
        if batch_id == broken:
            raise RuntimeError("this batch cannot launch")
        return real_launch(store, batch_id, groups)

    monkeypatch.setattr(sweep_module, "launch", launch)
    repaired = sweep(batches, launch_grace_s=0.0)
    assert repaired["launched"] == 1
    assert len(batches.group_job_ids(healthy, 1)) == 4 and batches.group_job_ids(broken, 1) == []
