"""NeMo Gym serves the rollouts agent, and its rollout client gets the service's records (nemo-gym 0.4.0, real vLLM).

The driver (NeMo Gym's virtualenv, Python 3.13) starts the example config with NeMo Gym's own CLI (`gym env start`,
examples/nemo_gym) and posts rows to `/run` with NeMo Gym's `RolloutCollectionHelper.run_examples` (what NeMo-RL
calls); every answer is validated there with NeMo Gym's pydantic models. Here the answers are turned into NeMo-RL's
message log by NeMo-RL's rule and checked token by token against the jobs' records; failures are HTTP errors
(a row's own: 4xx naming the field; a failed job or an unreachable service: 5xx), never a reward.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli.embedded_redis import free_port
from rollouts_client import RolloutClient
from tests.support.trainers_env import nemo_gym_python
from tests.trainers.conftest import Service, run_driver
from tests.trainers.test_verl_agent_loop import segmented_job

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ANSWER = {"kind": "agent-answer", "problem": "What is 2 + 2?", "answer": "4", "stop_on_no_tool_call": False}
PARAMS = {"input": [{"role": "user", "content": "unused: the kind renders the prompt"}], "temperature": 1.0}


def row(task: dict[str, Any] | None, agent: str = "rollouts_agent", **more: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"agent_ref": {"name": agent}, "responses_create_params": {**PARAMS, "max_output_tokens": 40}}
    if task is not None:
        out["rollouts_task"] = task
    return {**out, **more}


def repeat(index: int, key: str = "q0") -> dict[str, Any]:
    """NeMo Gym's repeats of one task (its task and rollout indices), multi-turn: nudged up to 3 assistant turns."""
    return row({**ANSWER, "max_turns": 3}, rollouts_key=key, _ng_task_index=0, _ng_rollout_index=index)


@pytest.fixture(scope="module")
def runs(service: Service, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    given = {
        "head_port": free_port(),
        "unreachable_url": f"http://127.0.0.1:{free_port()}",
        "segmented_job": segmented_job(service.api_url),
        "responses": {
            "input": [],
            "max_output_tokens": 40,
            "metadata": {"rollouts_task": json.dumps({**ANSWER, "max_turns": 2})},
        },
        "rows": {
            "first": repeat(0),
            "second": repeat(1),
            "again": repeat(0),  # the same key and repeat: the same job
            "no_task": row(None),
            "no_kind": row({"problem": "x"}),
            "unknown_kind": row({"kind": "no-such-kind", "problem": "x"}),
            "fail": row({"kind": "agent-parity", "problem": "f?", "fail_eval": True}),
            "unreachable": row(ANSWER, agent="rollouts_agent_unreachable"),
        },
    }
    tmp = tmp_path_factory.mktemp("nemo-gym")
    return run_driver("nemo_gym_driver.py", service.model_dir, given, service.api_url, tmp, python=nemo_gym_python())


def nemo_rl_message_log(output: list[dict[str, Any]]) -> list[tuple[str, list[int], list[float]]]:
    """NeMo-RL's reading of NeMo Gym output items, its rule restated (NeMo-RL is not importable here: it needs
    torch and its own stack): nemo_rl/environments/nemo_gym.py at NVIDIA-NeMo/RL@7ea279abfbeb698b092856d0dab61e7cf39bc909,
    `_postprocess_nemo_gym_to_nemo_rl_result` (lines 830-952). Items with non-empty `generation_token_ids` are the
    trainable calls, in output order; each call's `prompt_token_ids` must begin with every token seen before it
    (earlier prompts and generations, over the whole output) or it asserts "Non-contiguous messages found!"; the new
    prompt tokens become a user message, the generation an assistant message with its logprobs."""
    seen: list[int] = []
    log: list[tuple[str, list[int], list[float]]] = []
    for item in output:
        if not item.get("generation_token_ids"):
            continue
        prompt = item["prompt_token_ids"]
        assert seen == prompt[: len(seen)], "Non-contiguous messages found!"
        log.append(("user", prompt[len(seen) :], []))
        log.append(("assistant", item["generation_token_ids"], item["generation_log_probs"]))
        seen += prompt[len(seen) :] + item["generation_token_ids"]
    return log


def assert_log_is_record(log: list[tuple[str, list[int], list[float]]], record: dict[str, Any]) -> None:
    """NeMo-RL's message log is the record token by token up to its last generation: user parts its prompt and
    observation spans (mask 0), assistant parts its generated spans with the backend's logprobs."""
    tokens, mask, logprobs = record["token_ids"], record["loss_mask"], record["logprobs"]
    assistant = [t for t in record["turns"] if t["role"] == "assistant"]
    assert [part for part in log if part[0] == "assistant"], "no call"
    assert len(log) == 2 * len(assistant)
    position = 0
    for role, ids, lps in log:
        span = slice(position, position + len(ids))
        assert ids == tokens[span], (role, position)
        assert mask[span] == [1 if role == "assistant" else 0] * len(ids), (role, position)
        if role == "assistant":
            assert lps == pytest.approx(logprobs[span], abs=1e-6)
        position += len(ids)
    assert position == assistant[-1]["end"]


def detail(answer: dict[str, Any]) -> dict[str, Any]:
    return json.loads(answer["content"])["detail"]


def test_run_answers_each_assistant_turn_as_a_call_token_by_token(service: Service, runs):
    with RolloutClient(service.api_url) as client:
        for name, index in (("first", 0), ("second", 1)):
            answer = runs[name]
            assert answer["status"] == 200, answer
            result = answer["result"]
            job = client.get_job(result["rollouts_job_id"])
            record = job.trajectory
            assert result["reward"] == job.reward and job.reward is not None
            log = nemo_rl_message_log(result["response"]["output"])
            assert_log_is_record(log, record)
            turns = record["turns"]
            assert sum(t["role"] == "assistant" for t in turns) >= 2, "a multi-turn record: several calls"
            # the nudges between the turns are user items (no tokens); no call without its tokens
            nudges = [m for t in turns if t["role"] == "observation" for m in t["messages"] if m["role"] == "user"]
            users = [i for i in result["response"]["output"] if i.get("role") == "user"]
            assert [u["content"] for u in users] == [m["content"] for m in nudges] and nudges
            assert "NeMoGymResponseOutputMessageForTraining" in answer["item_classes"]
            # the row is echoed; the job carries NeMo Gym's indices as its group and sample
            assert result["agent_ref"] == {"name": "rollouts_agent"} and result["_ng_rollout_index"] == index
            request = job.raw["request"]
            assert request["sample_index"] == index and request["metadata"]["trainer"] == "nemo-gym"
            assert request["sampling"]["temperature"] == 1.0 and request["sampling"]["max_tokens"] == 40
    first, second = (client_job(service, runs[n]) for n in ("first", "second"))
    assert first.group_id == second.group_id and first.id != second.id


def client_job(service: Service, answer: dict[str, Any]) -> Any:
    with RolloutClient(service.api_url) as client:
        return client.get_job(answer["result"]["rollouts_job_id"])


def test_a_row_with_the_same_key_and_repeat_finds_its_job(runs):
    assert runs["again"]["status"] == 200, runs["again"]
    assert runs["again"]["result"]["rollouts_job_id"] == runs["first"]["result"]["rollouts_job_id"]


def test_bad_rows_are_a_4xx_naming_the_field(runs):
    for name, field in (
        ("no_task", "rollouts_task"),
        ("no_kind", "rollouts_task.kind"),
        ("unknown_kind", "body.task.kind"),
    ):
        answer = runs[name]
        assert answer["status"] == 422, (name, answer)
        assert detail(answer)["field"] == field and detail(answer)["error"] == "bad_row", (name, answer)
        assert "reward" not in answer["content"]


def test_a_failed_job_is_a_5xx_never_a_reward(runs):
    answer = runs["fail"]
    assert answer["status"] == 502, answer
    found = detail(answer)
    assert found["error"] == "job_failed" and "after 3 attempt(s)" in found["message"], found
    assert "reward" not in answer["content"]


def test_an_unreachable_service_is_a_5xx(runs):
    answer = runs["unreachable"]
    assert answer["status"] == 503, answer
    assert detail(answer)["error"] == "unreachable" and "reward" not in answer["content"]


def test_the_responses_route_runs_the_task_in_its_metadata(service: Service, runs):
    answer = runs["responses"]
    assert answer["status"] == 200, answer
    response = answer["response"]
    with RolloutClient(service.api_url) as client:
        job = client.get_job(response["id"].removeprefix("resp_"))
    assert job.raw["request"]["task"]["max_turns"] == 2
    assert_log_is_record(nemo_rl_message_log(response["output"]), job.trajectory)


def test_a_two_conversation_record_is_several_calls_never_concatenated(service: Service, runs):
    """Every segment's calls, oldest first, each segment its own run of calls that NeMo-RL's rule accepts; across two
    unrelated conversations the rule (over the whole output) refuses them: NeMo-RL trains such records with
    `on_segments: last`."""
    answer = runs["segmented"]
    output = answer["response"]["output"]
    with RolloutClient(service.api_url) as client:
        record = client.get_job(answer["response"]["id"].removeprefix("resp_")).trajectory
    segments = [*record["segments"], record]
    assert len(segments) == 2
    calls = [item for item in output if item.get("generation_token_ids")]
    per_segment = [sum(t["role"] == "assistant" for t in s["turns"]) for s in segments]
    assert len(calls) == sum(per_segment)
    start = 0
    for segment, count in zip(segments, per_segment):
        own = calls[start : start + count]
        assert_log_is_record(nemo_rl_message_log(own), segment)
        start += count
    with pytest.raises(AssertionError, match="Non-contiguous"):
        nemo_rl_message_log(output)
