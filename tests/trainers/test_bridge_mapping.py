"""The bridges' shared mapping, without a trainer: rows to tasks and sampling, records to the trainer's split."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rollouts_client.models import Job
from rollouts_client.trainers.engines import engine_url, engines_for
from rollouts_client.trainers.records import JobFailed, SegmentedRecord, split_record
from rollouts_client.trainers.rows import RowError, group_id, idempotency_key, sampling_from, task_from
from rollouts_client.trainers.settings import BridgeSettings
from rollouts_client.trainers.waiting import ServiceConnection


def record(**more):
    # prompt [1,2,3] | assistant [4,5] | observation [6] | assistant [7]
    return {
        "token_ids": [1, 2, 3, 4, 5, 6, 7],
        "loss_mask": [0, 0, 0, 1, 1, 0, 1],
        "logprobs": [None, None, None, -0.5, -0.25, None, -1.0],
        "prompt_length": 3,
        "stop_reason": "max_turns",
        "turns": [
            {"role": "prompt", "start": 0, "end": 3},
            {"role": "assistant", "start": 3, "end": 5, "policy_version": "v1", "weight_versions": []},
            {"role": "observation", "start": 5, "end": 6},
            {"role": "assistant", "start": 6, "end": 7, "policy_version": "v2", "weight_versions": []},
        ],
        **more,
    }


def job(trajectory, evaluation=None) -> Job:
    return Job(
        id="j1",
        status="done",
        reward=1.0,
        result={"trajectory": trajectory, "reward": 1.0, "evaluation": evaluation or {"reward": 1.0}},
    )


def test_the_prompt_is_the_first_span_and_the_response_every_later_one():
    split = split_record(job(record()))
    assert split.prompt_ids == [1, 2, 3] and split.response_ids == [4, 5, 6, 7]
    assert split.response_mask == [1, 1, 0, 1] and split.response_logprobs == [-0.5, -0.25, 0.0, -1.0]
    assert [v["policy_version"] for v in split.weight_versions] == ["v1", "v2"]
    assert split.num_turns == 4 and split.token_rewards is None and split.earlier_segments == 0


def test_per_token_rewards_from_the_evaluation_are_cut_to_the_response():
    split = split_record(job(record(), {"reward": 1.0, "token_rewards": [0, 0, 0, 0.1, 0.1, 0, 0.2]}))
    assert split.token_rewards == [0.1, 0.1, 0.0, 0.2]
    with pytest.raises(ValueError, match="3 token_rewards for 7 tokens"):
        split_record(job(record(), {"reward": 1.0, "token_rewards": [0, 0, 0]}))


def test_earlier_segments_train_on_the_last_or_are_refused():
    segmented = record(segments=[record(conversation="c1")], conversation="c0")
    split = split_record(job(segmented))
    assert split.earlier_segments == 1 and split.conversation == "c0", "the last call's segment, named"
    assert split_record(job(record())).conversation is None, "a record of the built-in loop names none"
    with pytest.raises(SegmentedRecord, match="1 earlier segment"):
        split_record(job(segmented), on_segments="raise")


def test_a_task_needs_a_kind_and_the_error_names_row_and_field():
    assert task_from(np.array({"kind": "math", "problem": "1+1"}, dtype=object), "3", "f") == {
        "kind": "math",
        "problem": "1+1",
    }
    assert task_from('{"kind": "code"}', "3", "f") == {"kind": "code"}
    with pytest.raises(RowError, match=r"row 3: extra_info.rollouts_task.kind: required"):
        task_from({"problem": "x"}, "3", "extra_info.rollouts_task")
    with pytest.raises(RowError, match=r"row 4: f: a dict"):
        task_from(7, "4", "f")


def test_sampling_maps_to_the_services_names():
    assert sampling_from({"temperature": 0.7, "top_k": 0, "logprobs": True, "max_generate_length": 32}) == {
        "temperature": 0.7,
        "top_k": -1,
        "max_tokens": 32,
    }
    assert sampling_from({"top_p": 1.0}, max_tokens=64) == {"top_p": 1.0, "max_tokens": 64}


def test_keys_and_group_ids_are_stable_and_fit_the_service():
    assert idempotency_key("run", 1, "a", 0) == idempotency_key("run", 1, "a", 0) != idempotency_key("run", 1, "a", 1)
    gid = group_id("run", "train", 1, "an instance / with spaces")
    assert len(gid) <= 128 and gid.replace("-", "").isalnum()


def test_settings_refuse_unknown_names_and_values():
    with pytest.raises(ValueError, match="unknown rollouts bridge settings"):
        BridgeSettings.from_mapping({"on_fail": "retry"})
    with pytest.raises(ValueError, match="on_failure"):
        BridgeSettings(on_failure="ignore")


def test_engine_settings_need_a_model_take_lists_and_refuse_unknown_modes(monkeypatch):
    with pytest.raises(ValueError, match="engines: one of"):
        BridgeSettings.from_mapping({"engines": "ray"})
    with pytest.raises(ValueError, match="model: required"):
        BridgeSettings.from_mapping({"engines": "trainer"})
    settings = BridgeSettings.from_mapping({"engines": "trainer", "model": "m", "engine_urls": ["10.0.0.5:8000"]})
    assert settings.engine_urls == ("10.0.0.5:8000",) and hash(settings)
    monkeypatch.setenv("ROLLOUTS_TRAINER_ENGINES", "trainer")
    monkeypatch.setenv("ROLLOUTS_TRAINER_ENGINE_URLS", "http://a:1, b:2,")
    from_env = BridgeSettings(model="m")
    assert from_env.engines == "trainer" and from_env.engine_urls == ("http://a:1", "b:2")


def test_engine_addresses_as_trainers_list_them_become_urls():
    assert engine_url("10.0.0.5:8000") == "http://10.0.0.5:8000"
    assert engine_url("[fe80::1]:8000") == "http://[fe80::1]:8000"
    assert engine_url("fe80::1:8000") == "http://[fe80::1]:8000"
    assert engine_url("https://node7:8000/") == "https://node7:8000"
    with pytest.raises(ValueError, match="engine_urls"):
        engine_url(" ")
    with pytest.raises(ValueError, match="engine_urls"):
        engines_for(BridgeSettings(model="m", engines="trainer", engine_urls=None), "skyrl", None)


class _FailedJobs:
    """The waiter's part of a connection: every job it is asked about ended failed with `error`."""

    def __init__(self, error: dict[str, str]) -> None:
        self.error, self.waited = error, []

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        self.waited.append(job_id)
        return Job(id=job_id, status="failed", error={"stage": "rollout", **self.error})


@pytest.mark.parametrize(("error_type", "attempts"), [("prompt_too_long", 1), ("ValueError", 3)])
def test_a_job_whose_input_cannot_run_is_raised_at_once_not_retried(error_type, attempts):
    message = "the rendered prompt has 1240 tokens, more than limits.max_prompt_tokens=1024; nothing was generated"
    connection = ServiceConnection(BridgeSettings(api_url="http://127.0.0.1:9", on_failure="retry", max_attempts=3))
    connection.waiter = waiter = _FailedJobs({"type": error_type, "message": message})

    async def resubmit(bodies, keys, rows):
        return [f"j{len(waiter.waited) + 1}"]

    connection.submit = resubmit
    with pytest.raises(JobFailed) as raised:
        asyncio.run(connection.settle({"task": {"kind": "math"}}, "k", "7 (gsm8k)", "j1"))
    assert len(waiter.waited) == attempts, "an input error fails the same way again: never resubmitted"
    assert str(raised.value).startswith(f"row 7 (gsm8k): job j{attempts} ended failed")
    assert message in str(raised.value) and ("(prompt_too_long)" in str(raised.value)) == (attempts == 1)
