"""max_staleness against a real redis-server, jobs moved by hand: versions ordered by the update call,
a sample whose oldest turn is too far behind is not delivered, is counted, and its prompt is replaced."""

from __future__ import annotations

import pytest
from redis import Redis

from shared.batches.replenish import batch_store, start_batch
from shared.batches.spec import BatchRequest
from shared.batches.staleness import is_stale, turn_versions
from shared.batches.store import BatchStore
from shared.config import Settings
from shared.jobs.store import JobStore
from shared.weights.versions import WeightVersions
from tests.batches.driving import finish_job

INFORMATIVE = [0.0, 1.0]


@pytest.fixture()
def batches(redis: Redis, settings: Settings) -> BatchStore:
    return batch_store(JobStore(redis, settings))


def trajectory(*turn_spans: list[str]) -> dict:
    """Assistant turns of model `tiny`, each sampled by the listed versions in order."""
    return {
        "turns": [
            {
                "role": "assistant",
                "model": "tiny",
                "policy_version": spans[0],
                "weight_versions": [{"version": v, "start": i, "end": i + 1} for i, v in enumerate(spans)],
            }
            for spans in turn_spans
        ]
    }


def finish_with(batches: BatchStore, job_id: str, traj: dict, reward: float) -> None:
    batches.jobs.set_fields(job_id, batches.jobs.store_part(job_id, "rollout", traj))
    finish_job(batches, job_id, "done", reward)


def test_versions_are_ordered_by_application_and_an_older_one_is_refused(redis: Redis, batches: BatchStore) -> None:
    versions = WeightVersions(redis, batches.jobs.keys)
    assert versions.current("tiny").seq == 0
    assert versions.record("tiny", "v-a", "/ckpt/a") == 1
    assert versions.record("tiny", "v-b", "/ckpt/b") == 2
    versions.check_forward("tiny", "v-b")  # the current one again: a retry
    versions.check_forward("tiny", "v-c")  # new
    with pytest.raises(RuntimeError, match="only move forward"):
        versions.check_forward("tiny", "v-a")
    assert versions.seqs("tiny", ["default", "v-a", "v-b", None]) == [0, 1, 2, 0]
    assert versions.current("other").seq == 0  # per model
    # a version reserved for an update no backend took does not block the next one, nor go back
    assert versions.reserve("tiny", "v-failed") == 3 and versions.current("tiny").seq == 2
    assert versions.seqs("tiny", ["v-failed"]) == [3]  # a turn sampled as a backend resumes already maps
    assert versions.record("tiny", "v-c", "/ckpt/c") == 3
    versions.check_forward("tiny", "v-failed")  # never current: a retry later is still forward
    assert versions.record("tiny", "v-failed", "/ckpt/f") == 4


def test_turn_versions_read_every_span_and_fall_back_to_policy_version() -> None:
    model, seen = turn_versions(
        {
            "turns": [
                {"role": "user"},
                {"role": "assistant", "model": "m", "policy_version": "x"},
                *trajectory(["a", "b"])["turns"],
            ]
        }
    )
    assert model == "m" and seen == {"x", "a", "b"}


def test_a_stale_sample_keeps_its_group_out_and_the_next_prompt_runs(redis: Redis, batches: BatchStore) -> None:
    versions = WeightVersions(redis, batches.jobs.keys)
    for name in ("v1", "v2", "v3"):
        versions.record("tiny", name, f"/ckpt/{name}")  # current: v3 (seq 3)
    prompts = [{"task": {"kind": "sim", "n": i}} for i in range(4)]
    batch_id = start_batch(
        batches,
        BatchRequest(prompts=prompts, n_samples=2, min_informative_groups=1, max_groups_in_flight=1, max_staleness=1),
        prompts,
    )
    first, second = batches.group_job_ids(batch_id, 0)
    # one turn mixes v3 with v1 (two updates behind): its oldest decides, so the sample is stale
    finish_with(batches, first, trajectory(["v3"], ["v1", "v3"]), 0.0)
    finish_with(batches, second, trajectory(["v3"]), 1.0)
    assert is_stale(batches.jobs, first, 1) and not is_stale(batches.jobs, second, 1)
    head = batches.head(batch_id)
    assert head["stale"] == 1 and head["used"] == 0 and head["status"] == "running"
    assert batches.group(batch_id, 0)["outcome"] == "stale"
    assert batches.in_flight_groups(batch_id) == [1], "the stale group's place goes to the next prompt"
    reported = [f for _, f in redis.xrange(batches.keys.stream(batch_id)) if f[b"type"] == b"group"]
    assert reported == [], "a stale group is never delivered for training"
    # within the bound (v2 is one update behind v3) the group is delivered
    third, fourth = batches.group_job_ids(batch_id, 1)
    finish_with(batches, third, trajectory(["v2"]), 0.0)
    finish_with(batches, fourth, trajectory(["v3"]), 1.0)
    head = batches.head(batch_id)
    assert head["status"] == "completed" and head["used"] == 1 and head["stale"] == 1


def test_start_up_weights_count_as_update_zero(redis: Redis, batches: BatchStore) -> None:
    """A backend restarted on its start-up checkpoint labels tokens 'default': stale once updates moved on."""
    versions = WeightVersions(redis, batches.jobs.keys)
    prompts = [{"task": {"kind": "sim"}}]
    batch_id = start_batch(batches, BatchRequest(prompts=prompts, n_samples=1, max_staleness=0), prompts)
    [job_id] = batches.group_job_ids(batch_id, 0)
    batches.jobs.set_fields(job_id, batches.jobs.store_part(job_id, "rollout", trajectory(["default"])))
    assert not is_stale(batches.jobs, job_id, 0)  # no update yet: default is current
    versions.record("tiny", "v1", "/ckpt/v1")
    assert is_stale(batches.jobs, job_id, 0)
    finish_job(batches, job_id, "done", 1.0)
    head = batches.head(batch_id)
    assert head["stale"] == 1 and head["used"] == 0 and head["status"] == "exhausted"
