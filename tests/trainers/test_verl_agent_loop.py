"""verl's own AgentLoopWorker runs rows through the service's agent loop (verl==0.9.1, real vLLM backend).

verl's `generate_sequences` instantiates the loop from an agent-loop YAML (examples/verl/agent_loops.yaml
as a user registers it), awaits it per row, pads and masks each output (`_agent_loop_postprocess`) and
stacks the batch with `rm_scores` (`_postprocess`); the tests read the jobs back and check every tensor
against the token-exact record, token by token. Every batch runs in one driver process (verl's import
and config are most of a run), and a second process is the restarted trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cli.embedded_redis import free_port
from rollouts_client import RolloutClient
from tests.trainers.conftest import Service, run_driver

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

WIDTH = 1024  # the driver's rollout.prompt_length and response_length
LOOP_TARGET = "rollouts_client.trainers.verl_agent_loop.RolloutsAgentLoop"


def row(index: int, uid: str, task: dict[str, Any] | None, **extra_info: Any) -> dict[str, Any]:
    info = {"index": index, **extra_info}
    if task is not None:
        info["rollouts_task"] = task
    return {
        "raw_prompt": [{"role": "user", "content": "unused"}],
        "extra_info": info,
        "index": index,
        "data_source": "test",
        "agent_name": "rollouts",
        "uid": uid,
    }


def parity(problem: str, **more: Any) -> dict[str, Any]:
    return {"kind": "agent-parity", "problem": problem, "stop_on_no_tool_call": False, "max_turns": 3, **more}


def agent_loops(directory: Path, name: str, **settings: Any) -> str:
    """An agent-loop YAML like examples/verl/agent_loops.yaml with other settings."""
    path = directory / f"agent_loops-{name}.yaml"
    lines = ["- name: rollouts", f"  _target_: {LOOP_TARGET}", *(f"  {k}: {v}" for k, v in settings.items())]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


RESTART_ROWS = [row(3, "u", parity("again?"), rollouts_key="epoch0-3")] * 2


@pytest.fixture(scope="module")
def runs(service: Service, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("verl-runs")
    pair = [row(0, "p0", parity("2+2?")), row(0, "p0", parity("2+2?"))]
    batches = {
        # 3 turns of up to 300 tokens may pass response_length: cut as verl's own loops cut
        "records": {
            "rows": [*pair, row(1, "p1", parity("3*3?")), row(1, "p1", parity("3*3?"))],
            "loops": agent_loops(tmp, "records", max_tokens_per_turn=300),
        },
        "no_task": {"rows": [row(8, "bad", None)]},
        "no_kind": {"rows": [row(9, "k", {"problem": "x"})]},
        "unknown_kind": {"rows": [row(10, "k", {"kind": "no-such-kind", "problem": "x"})]},
        "fail_retry": {
            "rows": [row(4, "f1", parity("fails", fail_eval=True))],
            "loops": agent_loops(tmp, "retry", on_failure="retry", max_attempts=2),
        },
        "fail_raise": {
            "rows": [row(4, "f2", parity("fails", fail_eval=True))],
            "loops": agent_loops(tmp, "raise", on_failure="raise"),
        },
        "restart": {"rows": RESTART_ROWS, "env": {"ROLLOUTS_RUN_ID": "restart"}},
        "unreachable": {
            "rows": [row(0, "x", parity("anyone?"))],
            "env": {"ROLLOUTS_API_URL": f"http://127.0.0.1:{free_port()}"},
        },
    }
    return run_driver("verl_driver.py", service.model_dir, batches, service.api_url, tmp)


def test_verl_post_processing_gives_the_records_tensors_token_by_token(service: Service, runs):
    out = runs["records"]
    assert "error" not in out, out
    tensors, extra, pad = out["tensors"], out["extra"], out["pad_token_id"]
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
        expected = [logprobs[p + t] if mask[p + t] else 0.0 for t in range(n)] + [0.0] * (WIDTH - n)
        assert tensors["rollout_log_probs"][b] == pytest.approx(expected, abs=1e-6)
        scores = tensors["rm_scores"][b]
        assert scores[n - 1] == job.reward and all(s == 0 for i, s in enumerate(scores) if i != n - 1)
        assert extra["rollouts_evaluation"][b]["reward"] == job.reward
        assistant_turns = [t for t in record["turns"] if t["role"] == "assistant"]
        versions = extra["rollouts_weight_versions"][b]
        assert [v["policy_version"] for v in versions] == [t["policy_version"] for t in assistant_turns]
        assert extra["__num_turns__"][b] == len(record["turns"])
        assert job.raw["request"]["metadata"]["trainer"] == "verl"
        assert job.raw["request"]["sampling"]["max_tokens"] == 300
    assert multi_turn, "at least one record has observation spans between generations (nudged turns)"


def test_a_bad_row_fails_naming_the_row_and_field(runs):
    assert runs["no_task"]["error"] == "RowError"
    assert "row 8 (test): extra_info.rollouts_task: missing" in runs["no_task"]["message"]
    assert runs["no_kind"]["error"] == "RowError"
    assert "row 9 (test): extra_info.rollouts_task.kind: required" in runs["no_kind"]["message"]
    # what only the service knows (its kinds) comes back as its 422, still naming the row and the field
    assert runs["unknown_kind"]["error"] == "RowError"
    assert "row 10 (test): body.task.kind" in runs["unknown_kind"]["message"]


@pytest.mark.parametrize(("batch", "attempts"), [("fail_retry", 2), ("fail_raise", 1)])
def test_a_failed_job_is_retried_or_raised_never_a_reward(runs, batch, attempts):
    out = runs[batch]
    assert out.get("error") == "JobFailed", out
    assert f"ended failed after {attempts} attempt(s)" in out["message"]
    assert "evaluation fails by request" in out["message"]


def test_an_unreachable_service_is_retried_then_raised_never_a_reward(runs):
    assert runs["unreachable"].get("error") == "ConnectError", runs["unreachable"]


def test_a_restarted_trainer_finds_its_jobs_by_their_keys(service: Service, runs, tmp_path: Path):
    first = runs["restart"]
    assert "error" not in first, first
    ids = first["extra"]["rollouts_job_id"]
    assert len(set(ids)) == 2, "the two samples of one row are two jobs"
    again = run_driver(
        "verl_driver.py",
        service.model_dir,
        {
            "restart": {"rows": RESTART_ROWS, "env": {"ROLLOUTS_RUN_ID": "restart"}},
            "other_run": {"rows": RESTART_ROWS, "env": {"ROLLOUTS_RUN_ID": "another-run"}},
        },
        service.api_url,
        tmp_path,
    )
    assert again["restart"]["extra"]["rollouts_job_id"] == ids
    assert again["restart"]["tensors"]["responses"] == first["tensors"]["responses"]
    assert not set(again["other_run"]["extra"]["rollouts_job_id"]) & set(ids)
