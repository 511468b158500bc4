"""SkyRL's own code takes the service's generator output (skyrl==0.3.0, real vLLM backend).

The generator sends a whole GeneratorInput as one submission; SkyRL's `validate_generator_output`,
the trainer's `postprocess_generator_output` and `convert_to_training_input`, and its GRPO
advantage code run on what it returns. The test reads the jobs back and checks the output against
the records (order, groups, tokens, rewards, advantages).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from rollouts_client import RolloutClient
from tests.trainers.conftest import Service, run_driver

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def parity(problem: str, **more: Any) -> dict[str, Any]:
    return {"rollouts_task": {"kind": "agent-parity", "problem": problem, "stop_on_no_tool_call": False,
                              "max_turns": 3, **more}}  # fmt: skip


def generate(service: Service, tmp_path: Path, rows: list[dict[str, Any]], step: int, **settings: Any) -> tuple[int, dict]:
    path = tmp_path / f"input-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps({"rows": rows, "global_step": step, "settings": settings}))
    return run_driver("skyrl_driver.py", [str(service.model_dir), str(path)], service.api_url, tmp_path)


def test_skyrl_validation_and_grpo_run_on_the_generated_batch(service: Service, tmp_path: Path):
    # SkyRL's batches hold a prompt's samples together; within a group, the order is the input's to keep
    order = [("a", 2), ("a", 0), ("a", 1), ("b", 1), ("b", 0), ("b", 2)]
    rows = [{"instance_id": inst, "repetition_id": rep, "env_extras": parity(f"{inst}?")} for inst, rep in order]
    code, out = generate(service, tmp_path, rows, step=7, run_id="skyrl-test")
    assert code == 0, out
    generated = out["generated"]
    assert generated["trajectory_ids"] == [[r["instance_id"], r["repetition_id"]] for r in rows]
    with RolloutClient(service.api_url) as client:
        jobs = [client.get_job(job_id) for job_id in generated["job_ids"]]
    groups: dict[str, set[str]] = {}
    for i, (row, job) in enumerate(zip(rows, jobs)):
        record = job.trajectory
        p = record["prompt_length"]
        assert generated["prompt_token_ids"][i] == record["token_ids"][:p]
        assert generated["response_ids"][i] == record["token_ids"][p:]
        assert generated["loss_masks"][i] == record["loss_mask"][p:]
        assert generated["rollout_logprobs"][i] == [lp or 0.0 for lp in record["logprobs"][p:]]
        assert generated["rewards"][i] == job.reward and generated["stop_reasons"][i] == record["stop_reason"]
        assert job.sample_index == row["repetition_id"]
        assert job.raw["request"]["metadata"]["global_step"] == 7
        groups.setdefault(row["instance_id"], set()).add(job.group_id)
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
        mates = [j.reward for j, r in zip(jobs, rows) if r["instance_id"] == rows[i]["instance_id"]]
        expected = (job.reward - statistics.mean(mates)) / (statistics.stdev(mates) + 1e-6)
        assert advantages[i] == pytest.approx(lead + [expected] * n, abs=1e-4), (i, expected)
    assert "rollouts/bridge_s" in out["metrics"]


def test_per_token_rewards_reach_skyrl_as_lists(service: Service, tmp_path: Path):
    rows = [{"instance_id": "t", "repetition_id": rep, "env_extras": parity("t?", token_rewards=True)} for rep in range(2)]
    code, out = generate(service, tmp_path, rows, step=1, run_id="skyrl-tokens")
    assert code == 0, out
    for i, rewards in enumerate(out["generated"]["rewards"]):
        assert rewards == [0.01 * m for m in out["generated"]["loss_masks"][i]]


def test_a_bad_row_fails_naming_it_before_any_job_and_a_restart_finds_the_jobs(service: Service, tmp_path: Path):
    with RolloutClient(service.api_url) as client:
        before = len(client.list_jobs(limit=1000))
        rows = [{"instance_id": "x", "repetition_id": 0, "env_extras": parity("x?")},
                {"instance_id": "y", "repetition_id": 0, "env_extras": {"other": 1}}]  # fmt: skip
        code, out = generate(service, tmp_path, rows, step=2, run_id="skyrl-bad")
        assert code == 3 and out["error"] == "RowError", out
        assert out["message"].startswith("row 1: env_extras[1].rollouts_task: missing")
        assert len(client.list_jobs(limit=1000)) == before, "nothing was submitted"

        good = rows[:1]
        first = generate(service, tmp_path, good, step=2, run_id="skyrl-restart")
        again = generate(service, tmp_path, good, step=2, run_id="skyrl-restart")
        assert first[0] == again[0] == 0
        assert again[1]["generated"]["job_ids"] == first[1]["generated"]["job_ids"]
        assert len(client.list_jobs(limit=1000)) == before + 1


def test_a_failed_job_is_raised_never_a_reward(service: Service, tmp_path: Path):
    rows = [{"instance_id": "f", "repetition_id": 0, "env_extras": parity("f?", fail_eval=True)}]
    code, out = generate(service, tmp_path, rows, step=3, run_id="skyrl-fail", on_failure="raise")
    assert code == 3 and out["error"] == "JobFailed" and "after 1 attempt(s)" in out["message"], out
