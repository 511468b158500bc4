"""AgentTask's shared behaviour: validation at submit time, tool schemas, and where the loop's settings come from."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from shared.config import Settings
from shared.jobs.spec import JobRequest, SamplingParams
from shared.tasks import StageContext, TaskValidationError
from workers.kinds.agentic import AgentTask
from workers.rollout.agent_task import loop_config, sampling_for


class Kind(AgentTask):
    name = "test-agentic"
    tools = ("python", "bash", "finish")

    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task["q"]}]


def context(tmp_path: Path, spec: dict[str, Any], seconds: float = 3600, **settings: Any) -> StageContext:
    return StageContext(
        job_id="j",
        stage="rollout",
        request=JobRequest.model_validate(spec),
        outputs={},
        workspace=tmp_path,
        settings=Settings(state_dir=tmp_path, **settings),
        deadline=time.time() + seconds,
    )


def test_tool_schemas_follow_the_kinds_tools_in_order() -> None:
    assert [s["function"]["name"] for s in Kind().tool_schemas()] == ["python", "bash", "finish"]


@pytest.mark.parametrize(
    "task, field",
    [
        ({"max_turns": 0}, "max_turns"),
        ({"max_turns": True}, "max_turns"),
        ({"max_context_tokens": "8k"}, "max_context_tokens"),
        ({"tool_parser": "xml"}, "tool_parser"),
        ({"stop_on_no_tool_call": "yes"}, "stop_on_no_tool_call"),
    ],
)
def test_bad_loop_overrides_are_refused_at_submit(task: dict[str, Any], field: str) -> None:
    with pytest.raises(TaskValidationError, match=field):
        Kind().validate(task)
    Kind().validate({"max_turns": 3, "tool_parser": "llama3_json", "stop_on_no_tool_call": False})


def test_a_kind_naming_an_unknown_tool_is_refused() -> None:
    class Broken(Kind):
        tools = ("bash", "teleport")

    with pytest.raises(TaskValidationError, match="teleport"):
        Broken().validate({})


def test_the_task_overrides_the_job_which_overrides_the_deployment(tmp_path: Path) -> None:
    spec = {"task": {"kind": "k"}, "limits": {"max_turns": 7, "max_tokens": 9000}, "sampling": {"max_tokens": 256}}
    config = loop_config(Kind(), context(tmp_path, spec, agent_max_context_tokens=32768))
    assert (config.max_turns, config.max_context_tokens, config.max_tokens_per_turn) == (7, 9000, 256)
    assert config.allowed_tools == ("python", "bash", "finish") and config.stop_on_no_tool_call is True

    spec["task"] = {"kind": "k", "max_turns": 2, "max_context_tokens": 5000, "stop_on_no_tool_call": False}
    config = loop_config(Kind(), context(tmp_path, spec, agent_max_context_tokens=4096))
    assert (config.max_turns, config.max_context_tokens, config.stop_on_no_tool_call) == (2, 4096, False)


def test_defaults_and_a_short_stage_keeping_its_time_for_the_agent(tmp_path: Path) -> None:
    config = loop_config(Kind(), context(tmp_path, {"task": {"kind": "k"}}, seconds=20, agent_time_reserve_s=10))
    assert config.max_turns == 16 and config.max_tokens_per_turn == Settings().agent_max_tokens_per_turn
    assert 0 < config.time_reserve_s <= 2.0


def test_sampling_comes_from_the_job() -> None:
    params = SamplingParams(temperature=0.6, top_p=0.9, top_k=20, seed=3, stop_token_ids=[7])
    sampling = sampling_for(params, max_tokens=128)
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed) == (0.6, 0.9, 20, 3)
    assert sampling.stop_token_ids == (7,) and sampling.max_tokens == 128
