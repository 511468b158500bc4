"""slime's rollout function backed by the service, run by slime's contract in miles' own code (PyPI `miles-rl`
0.0.2, radixark's fork of THUDM/slime, which keeps its Sample and rollout-function contract; slime itself is not
on PyPI). Real vLLM backend.

slime_driver.py (in the slime virtualenv): miles' RolloutDataSource reads the rows, its RolloutManager calls
`rollouts_client.trainers.slime.generate_rollout` through `call_rollout_fn` and turns the samples into training
data (`_convert_samples_to_train_data`, GRPO normalization); the tests check them against the job records token
by token: one batch per step, groups of n, DAPO's dynamic sampling, evaluation's shape, a cancelled job retried
or `remove_sample` (never a reward), bad rows, a refused kind, failed jobs raised, an unreachable service.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from rollouts_client import RolloutClient
from rollouts_client.models import Job
from tests.support.trainers_env import venv_python
from tests.trainers.conftest import Service, run_driver

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def parity(problem: str, **more: Any) -> dict[str, Any]:
    task = {"kind": "agent-parity", "problem": problem, "stop_on_no_tool_call": False, "max_turns": 2, **more}
    return {"prompt": problem, "label": None, "metadata": {"rollouts_task": task}}


GOOD = [parity("2+2?"), parity("3*3?")]


@pytest.fixture(scope="module")
def runs(service: Service, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cancel = {"cancel_one": True, "rows": [parity("c?")], "n": 2}  # the jobs wait for the cancel (slime_driver.py)
    cases = {
        "records": {"rows": GOOD, "n": 2, "settings": {"run_id": "slime-records"}},
        "dapo": {
            "rows": [parity(f"d{i}?") for i in range(4)],
            "n": 2,
            "rollout_batch_size": 1,
            "over_sampling_batch_size": 2,
            "dapo": True,
        },
        "eval": {"rows": GOOD, "n": 2, "eval": True},
        "bad_row": {"rows": [GOOD[0], {"prompt": "x", "label": None, "metadata": {}}]},
        "unknown_kind": {
            "rows": [GOOD[0], {"prompt": "x", "label": None, "metadata": {"rollouts_task": {"kind": "no-such-kind"}}}]
        },
        "top_p": {"rows": GOOD, "top_p": 0.9},
        "other_filter": {"rows": GOOD, "filter": "my.filters.keep_all"},
        "failing": {"rows": [parity("f?", fail_eval=True)], "settings": {"max_attempts": 2, "run_id": "slime-f"}},
        "raise": {"rows": [parity("r?", fail_eval=True)], "settings": {"on_failure": "raise"}},
        "cancel_removed": {**cancel, "settings": {"max_attempts": 1, "run_id": "slime-c1"}},
        "cancel_retried": {**cancel, "settings": {"max_attempts": 2, "run_id": "slime-c2"}},
        "unreachable": {"rows": GOOD, "settings": {"api_url": "http://127.0.0.1:9"}},
        "segments_all": {"rows": GOOD, "settings": {"on_segments": "all"}},
    }
    python = venv_python("slime", "ROLLOUTS_SLIME_ENV")  # miles-rl 0.0.2 (scripts/setup.sh test)
    return run_driver(
        "slime_driver.py", service.model_dir, cases, service.api_url, tmp_path_factory.mktemp("slime"), python
    )


def jobs_of(service: Service, samples: list[dict[str, Any]]) -> list[Job]:
    with RolloutClient(service.api_url) as client:
        return [client.get_job(s["metadata"]["rollouts_job_id"]) for s in samples]


def expected_versions(record: dict[str, Any]) -> list[str]:
    """One version per assistant turn: its spans' versions, else its policy_version (none: left out)."""
    out: list[str] = []
    for turn in record["turns"]:
        if turn["role"] != "assistant":
            continue
        spans = [s["version"] for s in turn.get("weight_versions") or []]
        out += [str(v) for v in (spans or [turn.get("policy_version")]) if v is not None]
    return out


def assert_sample_is_its_record(sample: dict[str, Any], job: Job) -> None:
    record = job.trajectory
    p = record["prompt_length"]
    assert sample["tokens"] == record["token_ids"], "prompt + response, not re-tokenized"
    assert sample["response_length"] == len(record["token_ids"]) - p
    assert sample["loss_mask"] == record["loss_mask"][p:]
    assert sample["rollout_log_probs"] == [lp or 0.0 for lp in record["logprobs"][p:]]
    assert sample["reward"] == job.reward and not sample["remove_sample"]
    assert sample["weight_versions"] == expected_versions(record)
    assert sample["status"] in ("completed", "truncated")


def test_a_step_is_one_batch_and_slime_trains_on_the_records(service: Service, runs):
    out = runs["records"]
    assert "error" not in out, out
    samples = out["samples"]
    assert [(s["group_index"], s["index"]) for s in samples] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    jobs = jobs_of(service, samples)
    for sample, job in zip(samples, jobs):
        assert_sample_is_its_record(sample, job)
    assert all(s["weight_versions"] for s in samples), "every record's assistant turns report their version"
    batches = {job.raw["request"]["metadata"]["batch_id"] for job in jobs}
    assert len(batches) == 1 and out["metrics"]["rollouts/batches"] == 1, "the whole step: one submission"
    assert jobs[0].group_id == jobs[1].group_id != jobs[2].group_id == jobs[3].group_id
    assert [job.sample_index for job in jobs] == [0, 1, 0, 1]
    assert all(job.raw["request"]["limits"]["max_tokens"] == 3000 for job in jobs), "rollout_max_context_len"

    # miles' _convert_samples_to_train_data: the same tokens and masks, GRPO-normalized rewards per group
    train = out["train"]
    assert train["tokens"] == [s["tokens"] for s in samples]
    assert train["loss_masks"] == [s["loss_mask"] for s in samples]
    assert train["rollout_log_probs"] == [s["rollout_log_probs"] for s in samples]
    assert train["raw_reward"] == [job.reward for job in jobs]
    for g in (0, 2):
        group = [job.reward for job in jobs[g : g + 2]]
        for i, reward in enumerate(group):
            expected = (reward - statistics.mean(group)) / (statistics.stdev(group) + 1e-6)
            assert train["rewards"][g + i] == pytest.approx(expected, abs=1e-4)


def test_dapo_dynamic_sampling_runs_as_the_services_batch(service: Service, runs):
    out = runs["dapo"]
    assert "error" not in out, out
    samples = out["samples"]
    assert len(samples) == 2, "rollout_batch_size 1 group of n_samples_per_prompt 2"
    jobs = jobs_of(service, samples)
    for sample, job in zip(samples, jobs):
        assert_sample_is_its_record(sample, job)
    assert len({s["reward"] for s in samples}) == 2, "the kept group is informative (unequal rewards)"
    with RolloutClient(service.api_url) as client:
        batch = client.get_batch(jobs[0].raw["request"]["metadata"]["batch_id"])
    assert batch.mode == "dapo" and batch.target == 1 and batch.raw["max_groups_in_flight"] == 2
    assert out["metrics"]["rollouts/batches"] >= 1


def test_evaluation_returns_slimes_eval_shape(service: Service, runs):
    out = runs["eval"]
    assert "error" not in out, out
    data = out["eval"]["parity"]
    samples = data["samples"]
    assert [s["index"] for s in samples] == [0, 1, 2, 3]
    jobs = jobs_of(service, samples)
    for sample, job in zip(samples, jobs):
        assert_sample_is_its_record(sample, job)
    assert data["rewards"] == [job.reward for job in jobs]
    assert data["truncated"] == [s["status"] == "truncated" for s in samples]


def test_bad_rows_and_refused_settings_fail_before_any_job(runs):
    assert runs["bad_row"].get("error") == "RowError", runs["bad_row"]
    assert runs["bad_row"]["message"].startswith("row 2 (group 1): metadata.rollouts_task: missing"), runs["bad_row"]
    assert runs["unknown_kind"].get("error") == "RowError", runs["unknown_kind"]
    assert runs["unknown_kind"]["message"].startswith("row 2 (group 1): body.task.kind"), runs["unknown_kind"]
    assert runs["top_p"].get("error") == "ValueError" and "rollout_top_p" in runs["top_p"]["message"]
    assert (
        runs["other_filter"].get("error") == "ValueError" and "my.filters.keep_all" in runs["other_filter"]["message"]
    )


def test_a_failed_job_is_retried_then_raised_never_a_reward(runs):
    assert runs["failing"].get("error") == "JobFailed", runs["failing"]
    assert "after 2 attempt(s)" in runs["failing"]["message"], runs["failing"]
    assert runs["raise"].get("error") == "JobFailed", runs["raise"]
    assert "after 1 attempt(s)" in runs["raise"]["message"], runs["raise"]


def test_a_cancelled_job_becomes_remove_sample_with_no_reward_of_its_own(service: Service, runs):
    out = runs["cancel_removed"]
    assert "error" not in out, out
    assert out["cancelled"] and out["cancelled"][0]["cancelled"], out["cancelled"]
    done, gone = out["samples"]
    assert not done["remove_sample"] and gone["remove_sample"] and gone["status"] == "aborted"
    assert_sample_is_its_record(done, jobs_of(service, [done])[0])
    assert "cancelled" in gone["metadata"]["rollouts_failed"]
    assert gone["reward"] == done["reward"], "the group's done mean: no advantage, the baseline unchanged"
    assert out["train"]["loss_masks"][1] == [0] * gone["response_length"], "slime trains on nothing of it"
    assert out["metrics"]["rollouts/removed_samples"] == 1


def test_a_cancelled_job_is_retried_as_a_job_of_its_own(service: Service, runs):
    out = runs["cancel_retried"]
    assert "error" not in out, out
    attempts = sorted(s["metadata"]["rollouts_attempts"] for s in out["samples"])
    assert attempts == [1, 2], out["samples"]
    for sample, job in zip(out["samples"], jobs_of(service, out["samples"])):
        assert_sample_is_its_record(sample, job)


def test_an_unreachable_service_is_raised(runs):
    out = runs["unreachable"]
    assert out.get("error") in ("ConnectError", "ConnectionError", "RolloutsClientError"), out
