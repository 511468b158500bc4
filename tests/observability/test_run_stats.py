"""The run page's aggregates: what a job's end adds to its minute, and what a window of minutes reads back
(reward per version and kind, stage percentiles, tokens, LLM share, staleness, failures, pool hits, CSV).
Real redis-server; the live browser test (test_run_page.py) covers the job ends of a real stack."""

from __future__ import annotations

import csv
import io

import pytest

from shared.config import Settings
from shared.jobs.store import JobStore
from shared.keys import Keys
from shared.run_stats.fields import bucket_bounds, bucket_of, quantile
from shared.run_stats.record import observe, scopes_of, version_of, write
from shared.run_stats.summary import rollout_summary
from shared.run_stats.view import Window, run_stats
from shared.weights.versions import WeightVersions

TOKEN = "run-stats-token"
T0 = 1_790_000_040.0  # a minute's start


def record(status: str, kind: str, reward: float | None, rollout_s: float, version: str, **extra: object) -> dict:
    """A decoded job record, as JobStore.get returns it."""
    created = T0 - 30
    timings = {
        "init": {"queued": created, "started": created + 1, "ended": created + 2},
        "rollout": {"queued": created + 2, "started": created + 2.5, "ended": created + 2.5 + rollout_s},
    }
    summary = {"tokens": 100, "generated": 40, "llm_s": rollout_s / 2, "model": "m", "versions": [version, ""]}
    return {
        "id": "j",
        "status": status,
        "kind": kind,
        "reward": reward,
        "timings": timings,
        "created_at": created,
        "finished_at": created + 2.5 + rollout_s,
        "spec": {"metadata": {"run_id": "r1", "batch_id": "b1"}},
        "rollout_summary": {**summary, "sandbox": extra.pop("sandbox", "pool")},
        **extra,
    }


@pytest.fixture()
def keys(redis) -> Keys:
    versions = WeightVersions(redis, Keys())
    for label in ("step-1", "step-2", "step-3"):
        versions.declare("m", label, "trainer-run")
    return Keys()


def add(redis, keys: Keys, job: dict, at: float = T0) -> None:
    versions = WeightVersions(redis, keys)
    write(redis, keys, scopes_of(job), observe(job, lambda s: version_of(versions, s)), at, 3600)


def test_a_window_sums_its_minutes_by_version_kind_stage_and_reason(redis, keys):
    add(redis, keys, record("done", "math", 1.0, 4.0, "step-1"))
    add(redis, keys, record("done", "math", 0.0, 6.0, "step-2", sandbox="started"))
    add(redis, keys, record("done", "code", 0.5, 8.0, "step-2"))
    failed = record("failed", "code", None, 2.0, "step-3", error={"stage": "eval", "type": "RuntimeError"})
    add(redis, keys, failed, at=T0 + 61)
    add(redis, keys, record("done", "math", 1.0, 1.0, "step-3"), at=T0 - 3600)  # an hour before: outside

    stats = run_stats(JobStore(redis, Settings(), keys), Window("run:r1", T0 - 60, T0 + 120))
    totals = stats["totals"]
    assert (totals["jobs"], totals["done"], totals["failed"], totals["minutes"]) == (4, 3, 1, 2)
    assert totals["reward_mean"] == pytest.approx(0.5) and totals["rewards"] == 3
    assert (totals["tokens"], totals["generated_tokens"]) == (400, 160)
    assert totals["tokens_per_s"] == pytest.approx(160 / 120)  # over the two minutes
    assert totals["llm_share"] == pytest.approx(0.5)
    assert (totals["sandbox_pool"], totals["sandbox_started"]) == (3, 1)
    assert [(m["done"], m["failed"]) for m in stats["minutes"]] == [(3, 0), (0, 1)]

    versions = {row["version"]: row for row in stats["versions"]}
    assert [row["seq"] for row in stats["versions"]] == [1, 2]  # the failed sample has no reward
    assert versions["step-1"]["reward_mean"] == 1.0
    assert versions["step-2"]["by_kind"] == {"code": 0.5, "math": 0.0}
    assert {row["kind"]: (row["jobs"], row["reward_mean"]) for row in stats["kinds"]} == {
        "code": (2, 0.5),
        "math": (2, 0.5),
    }
    # Current is step-3: step-1 is 2 behind, step-2 1, step-3 none.
    assert stats["staleness"] == [{"behind": 0, "jobs": 1}, {"behind": 1, "jobs": 2}, {"behind": 2, "jobs": 1}]
    assert stats["failures"] == [{"reason": "failed: eval RuntimeError", "jobs": 1}]

    stages = {row["stage"]: row for row in stats["stages"]}
    rollout = stages["rollout"]
    assert rollout["count"] == 4 and rollout["mean_s"] == pytest.approx(5.0)
    # Percentiles from log buckets: within the bucket of the true value (12% wide).
    low, high = bucket_bounds(bucket_of(4.0))
    assert low <= rollout["p50_s"] <= high
    low, high = bucket_bounds(bucket_of(8.0))
    assert low <= rollout["p90_s"] <= high
    assert stages["queue_wait"]["mean_s"] == pytest.approx(1.5)

    # The batch and the service see the same jobs; the service's default hour leaves the old one out.
    assert run_stats(JobStore(redis, Settings(), keys), Window("batch:b1", 0, T0 + 120))["totals"]["jobs"] == 5
    assert run_stats(JobStore(redis, Settings(), keys), Window("all", T0 - 60, T0 + 120))["totals"]["jobs"] == 4
    assert {(r["kind"], r["id"]) for r in stats["recent"]} == {("run", "r1"), ("batch", "b1")}


def test_quantiles_of_log_buckets_stay_within_twelve_percent():
    values = [0.01 * 1.07**i for i in range(200)]
    buckets: dict[int, int] = {}
    for value in values:
        buckets[bucket_of(value)] = buckets.get(bucket_of(value), 0) + 1
    for q in (0.5, 0.9):
        true = sorted(values)[int(q * len(values)) - 1]
        assert quantile(buckets, q) == pytest.approx(true, rel=0.13)
    assert quantile({}, 0.5) is None


def test_a_summary_reads_tokens_llm_time_versions_and_the_sandbox_of_a_trajectory():
    from tests.observability.viewer_kind import sample_trajectory

    trajectory = sample_trajectory()
    trajectory.timings = {"llm_s": 0.2}
    trajectory.sandbox = "pool"
    summary = rollout_summary(trajectory.to_dict())
    assert summary == {
        "tokens": len(trajectory.token_ids),
        "generated": 82,
        "llm_s": 0.2,
        "model": "",
        "versions": [""],
        "sandbox": "pool",
    }
    assert rollout_summary({"turns": 1}) is None and rollout_summary({"turns": [], "given": True}) is None


def test_the_endpoint_answers_json_and_the_same_numbers_as_csv_and_names_a_bad_field(redis, keys, make_client):
    add(redis, keys, record("done", "math", 1.0, 4.0, "step-1"))
    client = make_client(api_tokens=[TOKEN])
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/v1/run-stats?run_id=r1").status_code == 401
    body = client.get("/v1/run-stats", params={"run_id": "r1"}, headers=auth).json()
    assert body["scope"] == {"kind": "run", "id": "r1", "since": 0.0, "until": pytest.approx(body["scope"]["until"])}
    assert body["totals"]["done"] == 1 and body["versions"][0]["version"] == "step-1"

    answer = client.get("/v1/run-stats", params={"run_id": "r1", "format": "csv"}, headers=auth)
    assert answer.headers["content-type"].startswith("text/csv")
    assert "run-stats-run_r1.csv" in answer.headers["content-disposition"]
    rows = list(csv.reader(io.StringIO(answer.text)))
    assert rows[0] == ["section", "key", "field", "value"]
    cells = {(s, k, f): v for s, k, f, v in rows[1:]}
    assert float(cells[("totals", "", "reward_mean")]) == body["totals"]["reward_mean"]
    assert cells[("version", "1", "reward_mean:math")] == "1.0"
    assert int(cells[("stage", "rollout", "count")]) == 1
    assert cells[("minute", str(int(T0)), "done")] == "1"

    for params, field in (
        ({"run_id": "r1", "batch_id": "b1"}, "run_id"),
        ({"since": "10", "until": "5"}, "since"),
        ({"until": "inf"}, "until"),
        ({"since": "yesterday"}, "since"),
        ({"format": "xml"}, "format"),
        ({"run_id": ""}, "run_id"),
    ):
        answer = client.get("/v1/run-stats", params=params, headers=auth)
        assert answer.status_code == 422, (params, answer.text)
        assert any(field in str(error.get("loc", error)) for error in answer.json()["errors"]), answer.json()
