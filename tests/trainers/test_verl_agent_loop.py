"""verl's own workers run rows through the service's agent loop (verl==0.9.1, real vLLM backend).

V1 (verl's default, `trainer.use_v1: true`; verl_v1_driver.py): TransferQueue on a local Ray, verl's
`AgentLoopWorkerTQ` runs `rollout.n` sessions of each prompt (the loop's `run()` with `uid`, `session_id`,
`global_steps`) and stores every output with its own post-processing; what TransferQueue holds is checked
against the records token by token, a re-issued prompt in a second process finds its jobs, a two-segment record is
two outputs, and verl's `ReplayBufferAsync` drops a stale prompt and reads the int min/max_global_steps tags.

Legacy (verl_driver.py): verl's `generate_sequences` instantiates the loop from an agent-loop YAML (examples/verl/agent_loops.yaml
as a user registers it), awaits it per row, pads and masks each output (`_agent_loop_postprocess`) and
stacks the batch with `rm_scores` (`_postprocess`); the tests read the jobs back and check every tensor
against the token-exact record, token by token. Every batch runs in one driver process (verl's import
and config are most of a run), and a second process is the restarted trainer.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.embedded_redis import free_port
from rollouts_client import RolloutClient
from tests.trainers.conftest import Service, run_driver

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import external_agent

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
        # a prompt verl would cut: its job fails when the service renders it, and is not retried (default: retry)
        "long_prompt": {"rows": [row(11, "long", parity("x " * (2 * WIDTH)))]},
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


def test_a_prompt_over_prompt_length_fails_before_generation_naming_the_row(runs):
    out = runs["long_prompt"]
    assert out.get("error") == "JobFailed", out
    assert "row 11 (test): job " in out["message"]
    assert "ended failed (prompt_too_long) after 1 attempt(s)" in out["message"], "never retried: it would fail again"
    assert re.search(rf"the rendered prompt has \d+ tokens, more than limits.max_prompt_tokens={WIDTH}", out["message"])


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


# --- V1: AgentLoopWorkerTQ, TransferQueue, ReplayBufferAsync ---------------------------------------------------

V1_ROWS = [row(21, "v1-a", parity("2+2?")), row(22, "v1-b", parity("3*3?"))]
V1_ENV = {"ROLLOUTS_RUN_ID": "v1"}
STEP = 3  # the records' step: verl's servers then hold the weights of step 2


def segmented_job(api_url: str) -> str:
    """A finished job whose external agent held two conversations: its record has one earlier segment."""
    with httpx.Client(base_url=api_url, timeout=60) as api:
        answer = api.post(
            "/v1/jobs",
            json={
                "task": {"kind": "math", "problem": "What is 2 + 3?", "answer": "5"},
                "agent": "external",
                "sampling": {"max_tokens": 16, "seed": 3},
            },
        )
    answer.raise_for_status()
    job_id, endpoint = answer.json()["job_ids"][0], answer.json()["agent"][0]
    task = external_agent.wait_until_serving(endpoint)
    headers = {"Authorization": f"Bearer {endpoint['api_key']}"}
    with httpx.Client(base_url=endpoint["base_url"], headers=headers, timeout=120) as agent:
        for messages in (task["messages"], [{"role": "user", "content": "Say 7."}]):  # two unrelated histories
            agent.post("/v1/chat/completions", json={"model": task["model"], "messages": messages}).raise_for_status()
        agent.post("/finish", json={"answer": "5"}).raise_for_status()
    with RolloutClient(api_url) as client:
        [job] = client.wait_jobs([job_id], timeout=120)
    assert job.status == "done" and len(job.trajectory["segments"]) == 1, job.raw
    return job_id


@pytest.fixture(scope="module")
def v1_runs(service: Service, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("verl-v1")
    given = {
        "env": V1_ENV,
        "loops": agent_loops(tmp, "v1"),  # on_segments unset: V1's default, every segment
        "steps": [
            {"name": "stale", "global_steps": 1, "rows": [row(20, "v1-stale", parity("1+1?"))]},
            {"name": "records", "global_steps": STEP, "rows": V1_ROWS},
        ],
        "jobs": {"segments": {"job_id": segmented_job(service.api_url), "uid": "v1-seg", "global_steps": STEP}},
        "sample": {"global_steps": STEP, "batch_size": 3, "max_off_policy_threshold": 1},
    }
    return run_driver("verl_v1_driver.py", service.model_dir, given, service.api_url, tmp)


def step_versions(split: dict[str, Any]) -> tuple[int, int] | None:
    """The step range of a record's assistant turns (`step-<n>` versions), as the loop reads it."""
    steps = [
        int(m[1])
        for turn in split["turns"]
        if turn["role"] == "assistant"
        for span in (turn.get("weight_versions") or [{"version": turn.get("policy_version")}])
        if isinstance(span.get("version"), str) and (m := re.fullmatch(r"step-(\d+)", span["version"]))
    ]
    return (min(steps), max(steps)) if steps else None


def assert_each_output_is_its_job(out: dict[str, Any], api_url: str, step: int, jobs: int) -> None:
    """Each stored output is its own job's record token by token, its reward on the last token, sent as verl's."""
    job_ids = [extra["rollouts_job_id"] for extra in out["extra"]]
    assert len(set(job_ids)) == jobs, "each session of each prompt is its own job"
    with RolloutClient(api_url) as client:
        records = [client.get_job(job_id) for job_id in job_ids]
    for b, job in enumerate(records):
        assert_output_is_record(out, b, job.trajectory, step)
        assert out["tensors"]["rm_scores"][b] == [0.0] * (len(out["tensors"]["responses"][b]) - 1) + [job.reward]
        assert job.raw["request"]["metadata"]["trainer"] == "verl"


def assert_output_is_record(out: dict[str, Any], b: int, record: dict[str, Any], step: int) -> None:
    """Output b, as V1 stored it in TransferQueue, is the record (or segment) token by token."""
    tokens, mask, logprobs = record["token_ids"], record["loss_mask"], record["logprobs"]
    p = record.get("prompt_length") or record["turns"][0]["end"]
    n = min(len(tokens) - p, WIDTH)
    tensors = {name: values[b] for name, values in out["tensors"].items()}
    assert tensors["prompts"] == tokens[:p]
    assert tensors["responses"] == tokens[p : p + n]
    assert tensors["input_ids"] == tokens[: p + n]
    assert tensors["response_mask"] == mask[p : p + n]
    assert tensors["position_ids"] == list(range(p + n))
    expected = [logprobs[p + t] if mask[p + t] else 0.0 for t in range(n)]
    assert tensors["rollout_log_probs"] == pytest.approx(expected, abs=1e-5)
    tag = out["tags"][b]
    low, high = step_versions(record) or (step - 1, step - 1)
    assert (tag["min_global_steps"], tag["max_global_steps"]) == (low, high)
    assert type(tag["min_global_steps"]) is int and type(tag["max_global_steps"]) is int
    assert tag["status"] == "success" and tag["global_steps"] == step


def test_v1_stores_every_session_of_a_prompt_as_its_record(service: Service, v1_runs):
    out = v1_runs["records"]
    assert "error" not in out, out
    assert out["keys"] == [f"{uid}_{s}_0" for uid in ("v1-a", "v1-b") for s in range(2)], out["keys"]
    assert all(tag["status"] == "finished" for tag in out["prompts"].values()), out["prompts"]
    assert_each_output_is_its_job(out, service.api_url, STEP, jobs=4)


def test_v1_a_reissued_prompt_finds_its_jobs(service: Service, v1_runs, tmp_path: Path):
    """verl re-issues an in-flight prompt after a resume with its uid and session ids, at a later step."""
    first = v1_runs["records"]
    again = run_driver(
        "verl_v1_driver.py",
        service.model_dir,
        {
            "env": V1_ENV,
            "loops": agent_loops(tmp_path, "v1"),
            "steps": [{"name": "again", "global_steps": STEP + 1, "rows": V1_ROWS}],
        },
        service.api_url,
        tmp_path,
    )["again"]
    assert "error" not in again, again
    assert again["keys"] == first["keys"]
    assert [e["rollouts_job_id"] for e in again["extra"]] == [e["rollouts_job_id"] for e in first["extra"]]
    assert again["tensors"]["responses"] == first["tensors"]["responses"]


def test_v1_a_two_segment_record_is_two_outputs(service: Service, v1_runs):
    out = v1_runs["segments"]
    assert "error" not in out, out
    assert out["outputs"] == 2 and out["keys"] == ["v1-seg_0_0", "v1-seg_0_1"], out
    with RolloutClient(service.api_url) as client:
        job = client.get_job(out["extra"][0]["rollouts_job_id"])
    record = job.trajectory
    for b, segment in enumerate([record["segments"][0], record]):
        assert_output_is_record(out, b, segment, STEP)
        assert out["extra"][b]["rollouts_conversation"] == segment["conversation"]
        assert out["extra"][b]["rollouts_earlier_segments"] == 1
        scores = out["tensors"]["rm_scores"][b]  # verl's as_dict: the reward on the last response token
        assert scores[-1] == job.reward and not any(scores[:-1]), "the evaluated segment's reward, on every output"


def test_v1_replay_buffer_drops_the_stale_prompt_and_reads_int_versions(v1_runs):
    assert v1_runs["stale"]["keys"] == ["v1-stale_0_0", "v1-stale_1_0"], v1_runs["stale"]
    sampled = v1_runs["sample"]
    assert "error" not in sampled, sampled
    assert sorted(sampled["keys"]) == sorted([*v1_runs["records"]["keys"], *v1_runs["segments"]["keys"]])
    assert sampled["metrics"]["training/off_policy/evicted_samples"] == 1 and sampled["refills"] == [1]
    assert all(type(v) is int for v in sampled["min_global_steps"] + sampled["max_global_steps"])
    assert len(sampled["staleness"]) == len(sampled["keys"])
