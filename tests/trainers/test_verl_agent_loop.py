"""verl's own AgentLoopWorker runs rows through the service's agent loop (verl==0.9.1, real vLLM backend).

verl's `generate_sequences` instantiates the loop from examples/verl/agent_loops.yaml, awaits it per
row, pads and masks each output (`_agent_loop_postprocess`) and stacks the batch with `rm_scores`
(`_postprocess`); the test reads the jobs back and checks every tensor against the token-exact
record, token by token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollouts_client import RolloutClient
from tests.trainers.conftest import Service, run_driver

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

WIDTH = 1024  # the driver's rollout.prompt_length and response_length


def row(index: int, uid: str, task: dict[str, Any] | None, **extra_info: Any) -> dict[str, Any]:
    info = {"index": index, **extra_info}
    if task is not None:
        info["rollouts_task"] = task
    return {"raw_prompt": [{"role": "user", "content": "unused"}], "extra_info": info, "index": index,
            "data_source": "test", "agent_name": "rollouts", "uid": uid}  # fmt: skip


def parity(problem: str, **more: Any) -> dict[str, Any]:
    return {"kind": "agent-parity", "problem": problem, "stop_on_no_tool_call": False, "max_turns": 3, **more}


def write_rows(tmp_path: Path, rows: list[dict[str, Any]]) -> str:
    path = tmp_path / f"rows-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(rows))
    return str(path)


def agent_loops(tmp_path: Path, **settings: Any) -> str:
    """An agent-loop YAML like examples/verl/agent_loops.yaml with other settings."""
    path = tmp_path / "agent_loops.yaml"
    lines = ["- name: rollouts", "  _target_: rollouts_client.trainers.verl_agent_loop.RolloutsAgentLoop"]
    path.write_text("\n".join(lines + [f"  {k}: {v}" for k, v in settings.items()]) + "\n")
    return str(path)


def test_verl_post_processing_gives_the_records_tensors_token_by_token(service: Service, tmp_path: Path):
    rows = [row(0, "p0", parity("2+2?")), row(0, "p0", parity("2+2?")), row(1, "p1", parity("3*3?")),
            row(1, "p1", parity("3*3?"))]  # fmt: skip
    loops = agent_loops(tmp_path, max_tokens_per_turn=300)  # 3 turns may pass response_length: cut as verl cuts
    code, out = run_driver("verl_driver.py", [str(service.model_dir), write_rows(tmp_path, rows)], service.api_url,
                           tmp_path, VERL_AGENT_LOOPS=loops)  # fmt: skip
    assert code == 0, out
    tensors, extra = out["tensors"], out["extra"]
    pad = out["pad_token_id"]
    job_ids = extra["rollouts_job_id"]
    assert len(set(job_ids)) == 4, "each row, each sample of a prompt included, is its own job"
    with RolloutClient(service.api_url) as client:
        jobs = [client.get_job(job_id) for job_id in job_ids]
    multi_turn = 0
    for b, job in enumerate(jobs):
        record = job.trajectory
        tokens, mask, logprobs = record["token_ids"], record["loss_mask"], record["logprobs"]
        p = record["prompt_length"]
        n = min(len(tokens) - p, WIDTH)  # verl's own loops cut the response at response_length
        assert extra["rollouts_response_truncated"][b] == (len(tokens) - p > WIDTH)
        multi_turn += sum(t["role"] == "assistant" for t in record["turns"]) > 1
        assert tensors["prompts"][b] == [pad] * (WIDTH - p) + tokens[:p]
        assert tensors["responses"][b] == tokens[p : p + n] + [pad] * (WIDTH - n)
        assert tensors["input_ids"][b] == tensors["prompts"][b] + tensors["responses"][b]
        assert tensors["attention_mask"][b] == [0] * (WIDTH - p) + [1] * (p + n) + [0] * (WIDTH - n)
        assert tensors["response_mask"][b] == mask[p : p + n] + [0] * (WIDTH - n)
        assert tensors["position_ids"][b][WIDTH - p : WIDTH + n] == list(range(p + n))
        for t in range(WIDTH):
            expected = logprobs[p + t] if t < n and mask[p + t] else 0.0
            assert tensors["rollout_log_probs"][b][t] == pytest.approx(expected or 0.0, abs=1e-6), (b, t)
        scores = tensors["rm_scores"][b]
        assert scores[n - 1] == job.reward and all(s == 0 for i, s in enumerate(scores) if i != n - 1)
        assert extra["rollouts_evaluation"][b]["reward"] == job.reward
        versions = extra["rollouts_weight_versions"][b]
        assistant_turns = [t for t in record["turns"] if t["role"] == "assistant"]
        assert [v["policy_version"] for v in versions] == [t["policy_version"] for t in assistant_turns]
        assert extra["__num_turns__"][b] == len(record["turns"])
        assert job.raw["request"]["metadata"]["trainer"] == "verl"
    assert multi_turn, "at least one record has observation spans between generations (nudged turns)"
    assert {job.reward for job in jobs} <= {0.0, 1.0}


def test_a_row_without_a_task_fails_naming_the_row_and_field_before_any_job(service: Service, tmp_path: Path):
    rows = [row(8, "bad", None)]
    code, out = run_driver("verl_driver.py", [str(service.model_dir), write_rows(tmp_path, rows)], service.api_url,
                           tmp_path)  # fmt: skip
    assert code == 3 and out["error"] == "RowError", out
    assert "row 8 (test): extra_info.rollouts_task: missing" in out["message"]
    rows = [row(9, "k", {"problem": "x"})]
    code, out = run_driver("verl_driver.py", [str(service.model_dir), write_rows(tmp_path, rows)], service.api_url,
                           tmp_path)  # fmt: skip
    assert code == 3 and out["error"] == "RowError", out
    assert "row 9 (test): extra_info.rollouts_task.kind: required" in out["message"]
    # what only the service knows (its kinds) comes back as its 422, still naming the row and the field
    rows = [row(10, "k", {"kind": "no-such-kind", "problem": "x"})]
    code, out = run_driver("verl_driver.py", [str(service.model_dir), write_rows(tmp_path, rows)], service.api_url,
                           tmp_path)  # fmt: skip
    assert code == 3 and out["error"] == "RowError" and "row 10 (test): body.task.kind" in out["message"], out


@pytest.mark.parametrize(("on_failure", "attempts"), [("retry", 2), ("raise", 1)])
def test_a_failed_job_is_retried_or_raised_never_a_reward(service: Service, tmp_path: Path, on_failure, attempts):
    loops = agent_loops(tmp_path, on_failure=on_failure, max_attempts=2, run_id=f"fail-{on_failure}")
    rows = [row(4, f"f-{on_failure}", parity("fails", fail_eval=True))]
    code, out = run_driver("verl_driver.py", [str(service.model_dir), write_rows(tmp_path, rows)], service.api_url,
                           tmp_path, VERL_AGENT_LOOPS=loops)  # fmt: skip
    assert code == 3 and out["error"] == "JobFailed", out
    assert f"ended failed after {attempts} attempt(s)" in out["message"] and "evaluation fails by request" in out["message"]


def test_a_restarted_trainer_finds_its_jobs_by_their_keys(service: Service, tmp_path: Path):
    rows = [row(3, "u", parity("again?", ), rollouts_key="epoch0-3")] * 2
    first = run_driver("verl_driver.py", [str(service.model_dir), write_rows(tmp_path, rows)], service.api_url, tmp_path)
    second = run_driver("verl_driver.py", [str(service.model_dir), write_rows(tmp_path, rows)], service.api_url,
                        tmp_path)  # fmt: skip
    assert first[0] == second[0] == 0
    ids = first[1]["extra"]["rollouts_job_id"]
    assert len(set(ids)) == 2 and second[1]["extra"]["rollouts_job_id"] == ids
    assert second[1]["tensors"]["responses"] == first[1]["tensors"]["responses"]
    other_run = run_driver("verl_driver.py", [str(service.model_dir), write_rows(tmp_path, rows)], service.api_url,
                           tmp_path, ROLLOUTS_RUN_ID="another-run")  # fmt: skip
    assert not set(other_run[1]["extra"]["rollouts_job_id"]) & set(ids)


def test_an_unreachable_service_is_retried_then_raised_never_a_reward(service: Service, tmp_path: Path):
    from cli.embedded_redis import free_port

    rows = [row(0, "x", parity("anyone?"))]
    code, out = run_driver("verl_driver.py", [str(service.model_dir), write_rows(tmp_path, rows)],
                           f"http://127.0.0.1:{free_port()}", tmp_path)  # fmt: skip
    assert code == 3 and out["error"] == "ConnectError", out
