"""The example's own agent (the `openai` package) driving rollouts through the whole service on real vLLM.

The stack is started as `rollouts up --backend-url` starts it, with the session's vLLM server on
the tiny model; the jobs are ordinary math jobs with `"agent": "external"`, evaluated as every job is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from cli.stack import Stack
from cli.vllm_server import VLLMServer
from shared.config import Settings
from shared.trajectory import ASSISTANT, Trajectory
from tests.external.conftest import renderer_for
from tests.support.trajectory_checks import assert_decodes_to_conversation
from tests.support.waiting import client_for, wait_for, wait_status
from tests.vllm.test_rollouts_on_vllm import recomputed_logprobs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import external_agent

pytestmark = pytest.mark.vllm

ENV = {"ROLLOUTS_HEARTBEAT_INTERVAL_S": "1", "ROLLOUTS_LLM_HEARTBEAT_INTERVAL_S": "1"}


@pytest.fixture(scope="module")
def stack(vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("external-stack")
    settings = Settings(redis_url=None, state_dir=tmp_path / "state")
    stack = Stack(settings, api_port=0, concurrency={"init": 1, "rollout": 2, "eval": 1}, log_dir=tmp_path / "logs",
                  backend_urls=[vllm_server.url], extra_env=ENV)  # fmt: skip
    stack.start()
    stack.wait_for_workers()
    yield stack
    stack.stop(timeout=20)


def test_the_example_agent_drives_a_token_exact_rollout_that_is_evaluated(
    stack: Stack, vllm_server: VLLMServer, tokenizer: Any
) -> None:
    api = client_for(stack)
    job_id, endpoint = external_agent.submit(api, "What is 2 + 3?", "5", max_turns=3, seed=11)
    task, conversation = external_agent.run_agent(endpoint, max_turns=3)
    record = wait_status(api, job_id, timeout=300)
    assert record["status"] == "done", record.get("error")
    assert isinstance(record["result"]["reward"], (int, float)) and record["result"]["evaluation"]
    trajectory = Trajectory.from_dict(record["result"]["trajectory"])  # validates every invariant
    assert trajectory.segments == [] and trajectory.stop_reason == "finish"
    assistant = [t for t in trajectory.turns if t.role == ASSISTANT]
    assert len(assistant) == 3 == sum(m["role"] == "assistant" for m in conversation)
    assert all(t.model == task["model"] and t.weight_versions for t in assistant)
    # token-exact: the record decodes to the conversation the template renders, turn by turn...
    renderer = renderer_for(tokenizer, task["tools"])
    assert_decodes_to_conversation(trajectory, renderer, task["messages"])
    # ...and every generated token's logprob is vLLM's own for that exact prefix
    recomputed = recomputed_logprobs(vllm_server.url, trajectory.token_ids)
    worst = max(abs(trajectory.logprobs[i] - recomputed[i]) for t in assistant for i in range(t.start, t.end))
    assert worst < 1e-3, f"the record is not what the model saw: max |logprob diff| {worst}"
    ended = httpx.post(f"{endpoint['base_url']}/v1/chat/completions", json={"model": task["model"], "messages": []},
                       headers={"Authorization": f"Bearer {endpoint['api_key']}"})  # fmt: skip
    assert ended.status_code == 409, "a call after the job ended"
    wait_for(lambda: api.get("/v1/backends").json()["inflight"] == 0, timeout=30, what="the pin released")


def test_an_agent_that_never_finishes_is_ended_by_the_time_limit_and_evaluated(stack: Stack) -> None:
    api = client_for(stack)
    job = {"task": {"kind": "math", "problem": "What is 1 + 1?", "answer": "2"}, "agent": "external",
           "limits": {"rollout_timeout_s": 12}}  # fmt: skip
    body = api.post("/v1/jobs", json=job).json()
    task = external_agent.wait_until_serving(body["agent"][0])  # serving; and then the agent goes quiet
    assert task["messages"] and task["tools"]
    record = wait_status(api, body["job_ids"][0], timeout=120)
    assert record["status"] == "done", record.get("error")
    trajectory = record["result"]["trajectory"]
    assert trajectory["stop_reason"] == "time_budget" and trajectory["token_ids"] == []
    assert record["result"]["reward"] == 0


def test_cancelling_a_served_job_ends_its_endpoint_and_keeps_the_partial_record(stack: Stack) -> None:
    api = client_for(stack)
    body = api.post("/v1/jobs", json={"task": {"kind": "math", "problem": "What is 4 + 4?", "answer": "8"},
                                      "agent": "external", "sampling": {"max_tokens": 8}}).json()  # fmt: skip
    job_id, endpoint = body["job_ids"][0], body["agent"][0]
    task = external_agent.wait_until_serving(endpoint)
    llm = openai.OpenAI(base_url=f"{endpoint['base_url']}/v1", api_key=endpoint["api_key"], max_retries=0)
    llm.chat.completions.create(model=task["model"], messages=task["messages"])
    assert api.delete(f"/v1/jobs/{job_id}").status_code == 200
    with pytest.raises(openai.ConflictError):
        llm.chat.completions.create(model=task["model"], messages=task["messages"])
    record = wait_for(lambda: (r := api.get(f"/v1/jobs/{job_id}").json()).get("partial") and r, timeout=60,
                      what="the partial record")  # fmt: skip
    partial = Trajectory.from_dict(record["partial"]["trajectory"])
    assert partial.stop_reason == "cancelled" and partial.counts.turns == 1
    wait_for(lambda: api.get("/v1/backends").json()["inflight"] == 0, timeout=30, what="the pin released")
