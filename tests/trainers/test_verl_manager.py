"""verl V1's trainer runs batches through the service's agent-loop manager (verl==0.9.1, real vLLM backend).

verl_manager_driver.py: verl's own TaskRunnerV1 makes the manager from `rollout.agent.agent_loop_manager_class`,
each batch is registered and dispatched as V1's trainer dispatches it, and what TransferQueue then holds is
checked against the job records token by token; a failing prompt is retried then marked `failure` (no
trajectory, no reward), a validation batch lands in `val`, verl's `ReplayBufferAsync` samples the stored
trajectories, and verl's own AgentLoopWorkerTQ running the agent loop on the same prompts finds the same jobs.
One driver process runs everything (verl's import and config are most of a run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.trainers.conftest import Service, run_driver
from tests.trainers.test_verl_agent_loop import agent_loops, assert_each_output_is_its_job, parity, row

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STEP = 3
ROWS = [row(31, "m-a", parity("2+2?")), row(32, "m-b", parity("3*3?"))]


@pytest.fixture(scope="module")
def runs(service: Service, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp: Path = tmp_path_factory.mktemp("verl-manager")
    given = {
        "env": {"ROLLOUTS_RUN_ID": "manager"},
        "loops": agent_loops(tmp, "manager", on_failure="retry", max_attempts=2),
        "steps": [
            {"name": "records", "global_steps": STEP, "rows": ROWS},
            {"name": "failing", "global_steps": STEP, "rows": [row(33, "m-f", parity("fails", fail_eval=True))]},
            {"name": "validation", "global_steps": STEP, "validate": True, "rows": [row(34, "m-v", parity("1+1?"))]},
        ],
        "sample": {"global_steps": STEP, "batch_size": 2, "max_off_policy_threshold": 1},
        "loop_path": {"name": "loop_path", "global_steps": STEP + 1, "rows": ROWS},
    }
    return run_driver("verl_manager_driver.py", service.model_dir, given, service.api_url, tmp)


def test_verl_makes_the_manager_and_it_stores_every_session_as_its_record(service: Service, runs):
    assert runs["manager"] == "RolloutsAgentLoopManager"
    out = runs["records"]
    assert "error" not in out, out
    assert out["submissions"] == [4], "the batch's 2 prompts x n=2 sessions: one request"
    assert out["stored_at_return"] == [], "generate_sequences returns before its trajectories are stored"
    assert out["keys"] == [f"{uid}_{s}_0" for uid in ("m-a", "m-b") for s in range(2)], out["keys"]
    assert all(tag["status"] == "finished" for tag in out["prompts"].values()), out["prompts"]
    assert_each_output_is_its_job(out, service.api_url, STEP, jobs=4)


def test_a_failing_prompt_is_retried_then_marked_failure_never_a_reward(runs):
    out = runs["failing"]
    assert "error" not in out, out
    assert out["submissions"] == [2, 1, 1], "one request for the batch, then one per retried job"
    assert out["keys"] == [] and out["prompts"]["m-f"]["status"] == "failure", out
    assert sum("ended failed after 2 attempt(s)" in e for e in runs["errors"]) == 2, runs["errors"]


def test_a_validation_batch_is_stored_in_val(runs):
    out = runs["validation"]
    assert "error" not in out, out
    assert out["keys"] == ["m-v_0_0"] and out["prompts"]["m-v"]["status"] == "finished", out  # val_kwargs.n = 1


def test_verl_replay_buffer_samples_the_stored_trajectories(runs):
    sampled = runs["sample"]
    assert "error" not in sampled, sampled
    assert sorted(sampled["keys"]) == runs["records"]["keys"]
    assert sampled["metrics"]["training/rollout_failure/evicted_samples"] == 1, sampled["metrics"]
    assert len(sampled["staleness"]) == 4 and all(type(v) is int for v in sampled["staleness"])


def test_the_agent_loop_path_finds_the_managers_jobs(runs):
    """verl's own worker and the agent loop, on the same prompts (a resume that changed path), find the same jobs."""
    again, first = runs["loop_path"], runs["records"]
    assert "error" not in again, again
    assert again["keys"] == first["keys"]
    assert [e["rollouts_job_id"] for e in again["extra"]] == [e["rollouts_job_id"] for e in first["extra"]]
    assert again["tensors"]["responses"] == first["tensors"]["responses"]
