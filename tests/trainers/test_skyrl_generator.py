"""SkyRL's own code takes the service's generator output (real vLLM backend), on both ends of the client's range:
skyrl 0.3.0 (the trainers' virtualenv, Python 3.11) and the newest 0.4 (its own, Python 3.13).

The generator sends a whole GeneratorInput as one submission; SkyRL's trainer `generate` (with its
`validate_generator_output`), `postprocess_generator_output` and `convert_to_training_input`, and its
GRPO advantage code run on what it returns. The tests read the jobs back and check the output against
the records (order, groups, tokens, rewards, advantages). Every batch runs in one driver process; the
step-wise batches (`generator.step_wise_trajectories`) and the time-splits batch find the jobs of the
one-row-per-trajectory batches again (same run, step and trajectories), so they add no job.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from rollouts_client import RolloutClient
from tests.support.trainers_env import SKYRL_PYTHONS
from tests.trainers.conftest import Service, run_driver

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# SkyRL's batches hold a prompt's samples together; within a group, the order is the input's to keep
ORDER = [("a", 2), ("a", 0), ("a", 1), ("b", 1), ("b", 0), ("b", 2)]


def parity(problem: str, **more: Any) -> dict[str, Any]:
    return {
        "rollouts_task": {
            "kind": "agent-parity",
            "problem": problem,
            "stop_on_no_tool_call": False,
            "max_turns": 3,
            **more,
        }
    }


def one(instance: str, task: dict[str, Any], repetition: int = 0) -> dict[str, Any]:
    return {"instance_id": instance, "repetition_id": repetition, "env_extras": task}


@pytest.fixture(scope="module", params=sorted(SKYRL_PYTHONS))
def skyrl(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(version, python): each SkyRL runs the whole module with jobs of its own (its run ids carry the version)."""
    return request.param, SKYRL_PYTHONS[request.param]()


@pytest.fixture(scope="module")
def counted(service: Service, skyrl: tuple[str, Path]) -> int:
    """Jobs on the service before the batches run (the bad batch must add none)."""
    with RolloutClient(service.api_url) as client:
        return len(client.list_jobs(limit=1000))


@pytest.fixture(scope="module")
def runs(
    service: Service, skyrl: tuple[str, Path], counted: int, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    good = [one("x", parity("x?"))]
    batches = {
        "bad": {"rows": [*good, one("y", {"other": 1})], "global_step": 2, "settings": {"run_id": "skyrl-bad"}},
        "unknown_kind": {
            "rows": [*good, one("z", {"rollouts_task": {"kind": "no-such-kind"}})],
            "global_step": 2,
            "settings": {"run_id": "skyrl-bad"},
        },
        "groups": {
            "rows": [one(inst, parity(f"{inst}?"), rep) for inst, rep in ORDER],
            "global_step": 7,
            "settings": {"run_id": "skyrl-test"},
        },
        "tokens": {
            "rows": [one("t", parity("t?", token_rewards=True), rep) for rep in range(2)],
            "global_step": 1,
            "settings": {"run_id": "skyrl-tokens"},
        },
        "steps": {
            "rows": [one(inst, parity(f"{inst}?"), rep) for inst, rep in ORDER],
            "global_step": 7,
            "settings": {"run_id": "skyrl-test"},
            "step_wise": True,
        },
        "time_splits": {
            "rows": [one(inst, parity(f"{inst}?"), rep) for inst, rep in ORDER],
            "global_step": 7,
            "settings": {"run_id": "skyrl-test"},
            "time_splits": True,
        },
        "token_steps": {
            "rows": [one("t", parity("t?", token_rewards=True), rep) for rep in range(2)],
            "global_step": 1,
            "settings": {"run_id": "skyrl-tokens"},
            "step_wise": True,
        },
        "restart_1": {"rows": good, "global_step": 2, "settings": {"run_id": "skyrl-restart"}},
        "restart_2": {"rows": good, "global_step": 2, "settings": {"run_id": "skyrl-restart"}},
        "fail": {
            "rows": [one("f", parity("f?", fail_eval=True))],
            "global_step": 3,
            "settings": {"run_id": "skyrl-fail", "on_failure": "raise"},
        },
    }
    version, python = skyrl
    for batch in batches.values():
        batch["settings"]["run_id"] += f"-{version}"
    out = run_driver(
        "skyrl_driver.py", service.model_dir, batches, service.api_url, tmp_path_factory.mktemp("skyrl"), python
    )
    assert out["groups"].get("skyrl", "").startswith(version), out["groups"]
    return out


def test_skyrl_validation_and_grpo_run_on_the_generated_batch(service: Service, runs):
    out = runs["groups"]
    assert "error" not in out, out
    generated = out["generated"]
    assert generated["trajectory_ids"] == [list(pair) for pair in ORDER]
    # as SkyRL's own generator outside step-wise training; 0.3.0's GeneratorOutput has no time splits, 0.4's has
    assert generated["is_last_step"] is None
    assert out["declares_time_splits"] is not out["skyrl"].startswith("0.3")
    assert ("trajectory_time_splits" in generated["fields"]) is out["declares_time_splits"]
    with RolloutClient(service.api_url) as client:
        jobs = [client.get_job(job_id) for job_id in generated["job_ids"]]
    groups: dict[str, set[str]] = {}
    for i, ((instance, repetition), job) in enumerate(zip(ORDER, jobs)):
        record = job.trajectory
        p = record["prompt_length"]
        assert generated["prompt_token_ids"][i] == record["token_ids"][:p]
        assert generated["response_ids"][i] == record["token_ids"][p:]
        assert generated["loss_masks"][i] == record["loss_mask"][p:]
        assert generated["rollout_logprobs"][i] == [lp or 0.0 for lp in record["logprobs"][p:]]
        assert generated["rewards"][i] == job.reward and generated["stop_reasons"][i] == record["stop_reason"]
        assert job.sample_index == repetition
        assert job.raw["request"]["metadata"]["global_step"] == 7
        groups.setdefault(instance, set()).add(job.group_id)
    assert all(len(ids) == 1 for ids in groups.values()) and groups["a"] != groups["b"]

    # SkyRL's own tensors (left-padded sequences, right-aligned response tensors) and GRPO advantages
    training, advantages, pad = out["training"], out["advantages"], out["pad_token_id"]
    assert out["estimator"].lower().endswith("grpo")
    width, response_width = len(training["sequences"][0]), len(training["response_mask"][0])
    for i, job in enumerate(jobs):
        record = job.trajectory
        p, tokens = record["prompt_length"], record["token_ids"]
        n = len(tokens) - p
        assert training["sequences"][i] == [pad] * (width - p - n) + tokens
        assert training["attention_mask"][i] == [0] * (width - p - n) + [1] * (p + n)
        lead = [0] * (response_width - n)
        assert training["response_mask"][i] == lead + [1] * n
        assert training["loss_mask"][i] == lead + record["loss_mask"][p:]
        assert training["rollout_logprobs"][i] == pytest.approx(lead + [lp or 0.0 for lp in record["logprobs"][p:]])
        assert training["rewards"][i] == [0.0] * (response_width - 1) + [job.reward]
        mates = [j.reward for j, (instance, _) in zip(jobs, ORDER) if instance == ORDER[i][0]]
        expected = (job.reward - statistics.mean(mates)) / (statistics.stdev(mates) + 1e-6)
        assert advantages[i] == pytest.approx(lead + [expected] * n, abs=1e-4), (i, expected)
    assert "rollouts/bridge_s" in out["metrics"]


def test_per_token_rewards_reach_skyrl_as_lists(runs):
    out = runs["tokens"]
    assert "error" not in out, out
    for i, rewards in enumerate(out["generated"]["rewards"]):
        assert rewards == [0.01 * m for m in out["generated"]["loss_masks"][i]]


def test_a_bad_row_fails_naming_it_before_any_job_and_a_restart_finds_the_jobs(service: Service, runs, counted):
    assert runs["bad"].get("error") == "RowError", runs["bad"]
    assert runs["bad"]["message"].startswith("row 1: env_extras[1].rollouts_task: missing")
    # the service's 422 on the one submission names the row's job by its place in the list
    assert runs["unknown_kind"].get("error") == "RowError", runs["unknown_kind"]
    assert runs["unknown_kind"]["message"].startswith("row 1: body.task.kind"), runs["unknown_kind"]
    first, again = runs["restart_1"], runs["restart_2"]
    assert "error" not in first and "error" not in again
    assert again["generated"]["job_ids"] == first["generated"]["job_ids"]
    with RolloutClient(service.api_url) as client:
        # the bad batches submitted nothing; the restart added no job: 6 + 2 + 1 + 1 (failed) jobs in all
        assert len(client.list_jobs(limit=1000)) == counted + 10


def test_a_failed_job_is_raised_never_a_reward(runs):
    out = runs["fail"]
    assert out.get("error") == "JobFailed" and "after 1 attempt(s)" in out["message"], out


def assistant_starts(record: dict[str, Any]) -> list[tuple[int, int]]:
    """Each assistant turn's (start, end) in the record's tokens."""
    return [(t["start"], t["end"]) for t in record["turns"] if t["role"] == "assistant"]


def test_step_wise_output_is_one_row_per_assistant_turn_and_skyrl_trains_on_it(service: Service, runs):
    out, whole = runs["steps"], runs["groups"]
    assert "error" not in out, out
    generated = out["generated"]
    assert sorted(set(generated["job_ids"])) == sorted(whole["generated"]["job_ids"]), "the same jobs, found again"
    with RolloutClient(service.api_url) as client:
        jobs = [client.get_job(job_id) for job_id in whole["generated"]["job_ids"]]
    row, expected_advantage = 0, {}
    for (instance, repetition), job in zip(ORDER, jobs):
        record, tokens = job.trajectory, job.trajectory["token_ids"]
        spans = assistant_starts(record)
        ends = [start for start, _ in spans[1:]] + [len(tokens)]
        for j, ((start, generated_end), end) in enumerate(zip(spans, ends)):
            last = j == len(spans) - 1
            assert generated["job_ids"][row] == job.id and generated["trajectory_ids"][row] == [instance, repetition]
            assert generated["is_last_step"][row] is last
            # prompt: every token before the turn; response: the turn and the observation after it
            assert generated["prompt_token_ids"][row] == tokens[:start]
            assert generated["response_ids"][row] == tokens[start:end]
            assert generated["loss_masks"][row] == record["loss_mask"][start:end]
            assert generated["rollout_logprobs"][row] == [lp or 0.0 for lp in record["logprobs"][start:end]]
            rewards = [0.0] * (end - start)
            if last:
                rewards[generated_end - start - 1] = job.reward
            assert generated["rewards"][row] == rewards
            turn = [t for t in record["turns"] if t["role"] == "assistant"][j]
            own = turn.get("finish_reason") or record["stop_reason"]  # the turn's own (vLLM's), as SkyRL's steps
            assert generated["stop_reasons"][row] == (record["stop_reason"] if last else own)
            row += 1
        mates = [m.reward for m, (i, _) in zip(jobs, ORDER) if i == instance]
        expected_advantage[job.id] = (job.reward - statistics.mean(mates)) / (statistics.stdev(mates) + 1e-6)
    assert row == len(generated["response_ids"]) and row > len(ORDER), "multi-turn records: several steps each"

    # SkyRL's merge_stepwise_output joins a trajectory's steps back into the one-row-per-trajectory output
    merged, one_row = out["merged"], whole["generated"]
    assert merged["is_last_step"] == [True] * len(ORDER)
    for key in ("prompt_token_ids", "response_ids", "loss_masks"):
        assert merged[key] == one_row[key], key
    assert [sum(r) for r in merged["rewards"]] == one_row["rewards"]

    # the trainer's step-wise advantages: the last step's GRPO advantage on every step's response tokens
    training, advantages = out["training"], out["advantages"]
    for i, job_id in enumerate(generated["job_ids"]):
        expected = [expected_advantage[job_id] * m for m in training["response_mask"][i]]
        assert advantages[i] == pytest.approx(expected, abs=1e-4), (i, job_id)
    assert out["metrics"]["loss/avg_final_rewards"] == pytest.approx(statistics.mean(j.reward for j in jobs))


def test_step_wise_per_token_rewards_are_cut_per_step(runs):
    out = runs["token_steps"]
    assert "error" not in out, out
    generated = out["generated"]
    assert len(generated["job_ids"]) > len(set(generated["job_ids"])), "a multi-turn record: several steps"
    for rewards, mask in zip(generated["rewards"], generated["loss_masks"]):
        assert rewards == [0.01 * m for m in mask]


def test_trajectory_time_splits_are_the_records_llm_and_tool_seconds(service: Service, runs):
    """SkyRL 0.4.0's field, set here as where GeneratorOutput declares it (0.3.0 does not: not set there)."""
    out = runs["time_splits"]
    assert "error" not in out, out
    with RolloutClient(service.api_url) as client:
        timings = [client.get_job(job_id).trajectory["timings"] for job_id in out["generated"]["job_ids"]]
    assert out["generated"]["time_splits"] == {
        "llm": [t["llm_s"] for t in timings],
        "env": [t["tools_s"] for t in timings],
    }
