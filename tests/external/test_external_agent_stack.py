"""The example's own agent (the `openai` package) driving rollouts through the whole service on real vLLM.

The stack is started as `rollouts up --backend-url` starts it, with the session's vLLM server on
the tiny model; the jobs are ordinary math jobs with `"agent": "external"`, evaluated as every job is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from cli.stack import Stack
from cli.vllm_server import VLLMServer
from shared.config import Settings
from shared.trajectory import ASSISTANT, Trajectory
from tests.external.conftest import renderer_for
from tests.external.test_agent_formats import ANTHROPIC_TOOLS, SYSTEM, common_token_ids, run_openai_agents_at
from tests.on_vllm.test_rollouts_on_vllm import recomputed_logprobs
from tests.support.trajectory_checks import assert_decodes_to_conversation
from tests.support.waiting import client_for, wait_for, wait_status
from workers.rollout.external_agent import anthropic_api

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import external_agent

pytestmark = pytest.mark.vllm

ENV = {"ROLLOUTS_HEARTBEAT_INTERVAL_S": "1", "ROLLOUTS_LLM_HEARTBEAT_INTERVAL_S": "1"}


@pytest.fixture(scope="module")
def stack(vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("external-stack")
    settings = Settings(redis_url=None, state_dir=tmp_path / "state")
    stack = Stack(
        settings,
        api_port=0,
        concurrency={"init": 1, "rollout": 2, "eval": 1},
        log_dir=tmp_path / "logs",
        backend_urls=[vllm_server.url],
        extra_env=ENV,
    )
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
    ended = httpx.post(
        f"{endpoint['base_url']}/v1/chat/completions",
        json={"model": task["model"], "messages": []},
        headers={"Authorization": f"Bearer {endpoint['api_key']}"},
    )
    assert ended.status_code == 409, "a call after the job ended"
    wait_for(lambda: api.get("/v1/backends").json()["inflight"] == 0, timeout=30, what="the pin released")


def test_an_agent_that_never_finishes_is_ended_by_the_time_limit_and_evaluated(stack: Stack) -> None:
    api = client_for(stack)
    job = {
        "task": {"kind": "math", "problem": "What is 1 + 1?", "answer": "2"},
        "agent": "external",
        "limits": {"rollout_timeout_s": 12},
    }
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
    body = api.post(
        "/v1/jobs",
        json={
            "task": {"kind": "math", "problem": "What is 4 + 4?", "answer": "8"},
            "agent": "external",
            "sampling": {"max_tokens": 8},
        },
    ).json()
    job_id, endpoint = body["job_ids"][0], body["agent"][0]
    task = external_agent.wait_until_serving(endpoint)
    llm = openai.OpenAI(base_url=f"{endpoint['base_url']}/v1", api_key=endpoint["api_key"], max_retries=0)
    llm.chat.completions.create(model=task["model"], messages=task["messages"])
    assert api.delete(f"/v1/jobs/{job_id}").status_code == 200
    with pytest.raises(openai.ConflictError):
        llm.chat.completions.create(model=task["model"], messages=task["messages"])
    record = wait_for(
        lambda: (r := api.get(f"/v1/jobs/{job_id}").json()).get("partial") and r, timeout=60, what="the partial record"
    )
    partial = Trajectory.from_dict(record["partial"]["trajectory"])
    assert partial.stop_reason == "cancelled" and partial.counts.turns == 1
    wait_for(lambda: api.get("/v1/backends").json()["inflight"] == 0, timeout=30, what="the pin released")


def test_the_unmodified_sdks_run_through_the_apis_route_and_their_jobs_are_evaluated(
    stack: Stack, tokenizer: Any
) -> None:
    api = client_for(stack)
    job = {
        "task": {"kind": "math", "problem": "What is 2 + 3?", "answer": "5"},
        "agent": "external",
        "sampling": {"max_tokens": 24, "seed": 3},
    }
    stopping = {**job, "sampling": {**job["sampling"], "stop_token_ids": common_token_ids(tokenizer)}}
    body = api.post("/v1/jobs", json=[job, stopping]).json()
    (claude_job, agents_job), (claude_at, agents_at) = body["job_ids"], body["agent"]
    task = external_agent.wait_until_serving(claude_at)
    # the anthropic SDK, streamed, at the base_url the submit answer handed out (the API forwards it)
    llm = anthropic.Anthropic(base_url=claude_at["base_url"], api_key=claude_at["api_key"], max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
    for _ in range(2):
        with llm.messages.stream(
            model=task["model"], system=SYSTEM, messages=messages, tools=ANTHROPIC_TOOLS, max_tokens=16
        ) as events:
            reply = events.get_final_message()
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "no tools here"}
            for b in reply.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results or "Go on."})
    assert httpx.post(f"{claude_at['base_url']}/finish", headers={"x-api-key": claude_at["api_key"]}).status_code == 200
    # the OpenAI Agents SDK (its default Responses model), through the API's route too
    external_agent.wait_until_serving(agents_at)
    ran = run_openai_agents_at(agents_at["base_url"], agents_at["api_key"], task["model"], "What is 2 + 3?")
    assert ran["model_class"] == "OpenAIResponsesModel" and ran["responses"]
    httpx.post(f"{agents_at['base_url']}/finish", headers={"Authorization": f"Bearer {agents_at['api_key']}"})
    for job_id, turns in ((claude_job, 2), (agents_job, len(ran["responses"]))):
        record = wait_status(api, job_id, timeout=300)
        assert record["status"] == "done", record.get("error")
        assert isinstance(record["result"]["reward"], (int, float))
        trajectory = Trajectory.from_dict(record["result"]["trajectory"])  # validates every invariant
        assert trajectory.segments == [] and trajectory.stop_reason == "finish" and trajectory.counts.turns == turns
    task_messages = [{"role": "system", "content": SYSTEM}, messages[0]]
    claude_record = Trajectory.from_dict(api.get(f"/v1/jobs/{claude_job}").json()["result"]["trajectory"])
    renderer = renderer_for(tokenizer, anthropic_api.chat_tools(ANTHROPIC_TOOLS))
    assert_decodes_to_conversation(claude_record, renderer, task_messages)
