"""The whole service in front of real vLLM servers: token-exact multi-turn trajectories, versions, failover.

The stack is started the way a user does it (`Stack`, as `rollouts up --backend-url` does:
`rollouts register` beside each server), with the session's vLLM server on the tiny model; the
server the failover test kills is its own, launched in the background a few modules ahead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from cli.stack import Stack
from cli.vllm_server import VLLMServer
from shared.config import Settings
from shared.trajectory import ASSISTANT, Trajectory
from tests.support.vllm_server import (
    LOG_REQUESTS,
    freeze,
    kill_server,
    launch_server,
    register_launch,
    requests_taken,
    session_server,
    tiny_model_path,
)
from tests.support.waiting import client_for, wait_for, wait_status

pytestmark = pytest.mark.vllm

ENV = {
    "ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds",
    "ROLLOUTS_HEARTBEAT_INTERVAL_S": "1",
    "ROLLOUTS_MAINTENANCE_INTERVAL_S": "2",
    "ROLLOUTS_LLM_HEARTBEAT_INTERVAL_S": "1",
    "ROLLOUTS_LLM_HEARTBEAT_TIMEOUT_S": "5",
}


register_launch("doomed_vllm_server", lambda directory: launch_server(tiny_model_path(), directory, args=LOG_REQUESTS))


@pytest.fixture()
def doomed_vllm_server(tmp_path: Path) -> Iterator[VLLMServer]:
    """A server of the tiny model counting the requests it takes (LOG_REQUESTS), for a test to kill."""
    yield from session_server("doomed_vllm_server", tmp_path)


@pytest.fixture()
def stack_on(tmp_path: Path) -> Iterator[Callable[[list[VLLMServer]], Stack]]:
    stacks: list[Stack] = []

    def start(servers: list[VLLMServer]) -> Stack:
        settings = Settings(redis_url=None, state_dir=tmp_path / "state")
        stack = Stack(
            settings,
            api_port=0,
            concurrency={"init": 2, "rollout": 8, "eval": 2},
            log_dir=tmp_path / "logs",
            backend_urls=[s.url for s in servers],
            extra_env=ENV,
        )
        stacks.append(stack)
        stack.start()
        stack.wait_for_workers()
        return stack

    yield start
    for stack in stacks:
        stack.stop(timeout=20)


def submit(api: httpx.Client, n: int, seed: int, max_turns: int = 3) -> list[str]:
    jobs = [
        {
            "task": {
                "kind": "agent-answer",
                "problem": f"What is {i} + {i}?",
                "answer": str(2 * i),
                "stop_on_no_tool_call": False,
            },
            "limits": {"max_turns": max_turns, "max_tokens": 3000},
            "sampling": {"max_tokens": 48, "temperature": 1.0, "seed": seed + i},
        }
        for i in range(n)
    ]
    response = api.post("/v1/jobs", json=jobs)
    assert response.status_code == 202, response.text
    return response.json()["job_ids"]


def recomputed_logprobs(url: str, token_ids: list[int]) -> list[float | None]:
    """vLLM's own logprob of every token given everything before it (prompt_logprobs), from one prefill."""
    body = {"model": "tiny", "prompt": token_ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    entries = response.json()["choices"][0]["prompt_logprobs"]
    return [None if e is None else e[str(t)]["logprob"] for e, t in zip(entries, token_ids)]


def test_multi_turn_trajectories_are_token_exact_and_carry_vllms_versions(
    stack_on: Callable[[list[VLLMServer]], Stack], vllm_server: VLLMServer
) -> None:
    stack = stack_on([vllm_server])
    api = client_for(stack)
    ids = submit(api, 4, seed=100)
    worst = 0.0
    for job_id in ids:
        record = wait_status(api, job_id, timeout=300)
        assert record["status"] == "done", record.get("error")
        trajectory = Trajectory.from_dict(record["result"]["trajectory"])  # validates every invariant
        assistant = [t for t in trajectory.turns if t.role == ASSISTANT]
        assert len(assistant) >= 2, "nudged turns: the model never calls finish, so it runs to max_turns"
        assert all(t.model == "tiny" and t.policy_version == "default" for t in assistant)
        assert all(t.weight_versions == [{"version": "default", "start": 0, "end": t.length}] for t in assistant)
        recomputed = recomputed_logprobs(vllm_server.url, trajectory.token_ids)
        for turn in assistant:
            for position in range(turn.start, turn.end):
                worst = max(worst, abs(trajectory.logprobs[position] - recomputed[position]))
    assert worst < 1e-3, f"the record is not what the model saw: max |logprob diff| {worst}"
    wait_for(lambda: api.get("/v1/backends").json()["inflight"] == 0, timeout=30, what="pins released")


def test_a_backend_killed_mid_run_costs_no_job_and_leaves_no_count(
    stack_on: Callable[[list[VLLMServer]], Stack],
    vllm_server: VLLMServer,
    doomed_vllm_server: VLLMServer,
) -> None:
    doomed = doomed_vllm_server
    stack = stack_on([vllm_server, doomed])
    api = client_for(stack)
    freeze(doomed)  # the trajectories routed to it stay mid-request until it dies, however fast the machine
    ids = submit(api, 12, seed=200, max_turns=4)
    backends = {b["url"]: b["id"] for b in api.get("/v1/backends").json()["backends"]}
    wait_for(lambda: requests_taken(doomed) >= 1, timeout=120, what="the doomed server to take a request")
    assert _inflight(api, backends[doomed.url]) >= 1
    kill_server(doomed)
    interrupted = 0
    for job_id in ids:
        record = wait_status(api, job_id, timeout=600)
        if record["status"] == "done":
            Trajectory.from_dict(record["result"]["trajectory"])
        else:  # an infrastructure failure is recorded as such, never as a reward
            assert record["status"] == "failed" and record.get("result") is None, record
            assert "backend" in str(record["error"]).lower(), record["error"]
        assert set(record["failovers"]) <= {backends[doomed.url]}, record["failovers"]
        interrupted += bool(record["failovers"])
    assert interrupted >= 1, "no job's record shows that its backend died under it"
    survivor = backends[vllm_server.url]
    wait_for(lambda: _inflight(api, survivor) == 0, timeout=60, what="the survivor's in-flight count to return to 0")
    assert api.get("/v1/backends").json()["inflight"] == 0


def _inflight(api: httpx.Client, backend_id: str) -> int:
    return next(b["inflight"] for b in api.get("/v1/backends").json()["backends"] if b["id"] == backend_id)


def test_a_conversation_past_the_servers_context_stops_as_context_length(vllm_server: VLLMServer, tiny_model) -> None:
    """The loop believes in a bigger context than the server has: vLLM's generate route refuses the
    prompt in its own words, and the loop adopts the server's limit and stops instead of failing the job."""
    from transformers import AutoTokenizer

    from tests.agent.conftest import Unlimited
    from workers.rollout.agent_loop import AgentLoop, LoopConfig
    from workers.rollout.chat_delta import ChatRenderer
    from workers.rollout.llm_client import LLMClient
    from workers.rollout.llm_completion import Sampling
    from workers.rollout.tool_parsers import get_parser

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model, local_files_only=True))
    config = LoopConfig(
        max_turns=8,
        max_context_tokens=100_000,
        max_tokens_per_turn=400,
        allowed_tools=("finish",),
        stop_on_no_tool_call=False,
    )
    with LLMClient(request_timeout_s=300, max_retries=0) as client:
        generate = lambda ids, sampling: client.complete(vllm_server.url, ids, sampling, "tiny")  # noqa: E731
        loop = AgentLoop(
            renderer, get_parser("hermes"), generate, None, config, Sampling(max_tokens=400, seed=3), Unlimited()
        )
        record = loop.run([{"role": "user", "content": "x" * 3900}])
    assert record.stop_reason == "context_length", (record.stop_reason, record.stop_detail)
    # vLLM's generate route ran the first turn up to its 4096 tokens; the nudge after it is recorded
    # (the model never saw it: loss mask 0), and the next turn's refusal stopped the loop.
    last = [t for t in record.turns if t.role == ASSISTANT][-1]
    assert last.end <= 4096 and last.finish_reason == "length" and "4096" in (record.stop_detail or "")


def prompt_tokens_served(url: str) -> float:
    """Prompt tokens the server's engine has taken so far (vLLM's own counter, GET /metrics)."""
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:prompt_tokens_total"))


def answer_job(max_prompt_tokens: int) -> dict[str, object]:
    return {
        "task": {"kind": "agent-answer", "problem": "What is 2 + 2?", "answer": "4", "stop_on_no_tool_call": False},
        "limits": {"max_turns": 1, "max_tokens": 3000, "max_prompt_tokens": max_prompt_tokens},
        "sampling": {"max_tokens": 8, "seed": 5},
    }


def test_a_prompt_over_max_prompt_tokens_fails_the_job_before_any_generation(
    stack_on: Callable[[list[VLLMServer]], Stack], vllm_server: VLLMServer
) -> None:
    api = client_for(stack_on([vllm_server]))
    served = prompt_tokens_served(vllm_server.url)
    [over] = api.post("/v1/jobs", json=answer_job(8)).json()["job_ids"]
    record = wait_status(api, over, timeout=300)
    assert record["status"] == "failed", record
    error = record["error"]
    assert error["stage"] == "rollout" and error["type"] == "prompt_too_long", error
    named = re.search(r"the rendered prompt has (\d+) tokens, more than limits.max_prompt_tokens=8", error["message"])
    assert named, error["message"]
    partial = record["partial"]["trajectory"]  # the rendered prompt, and nothing generated
    assert [t["role"] for t in partial["turns"]] == ["prompt"] and len(partial["token_ids"]) == int(named[1])
    assert prompt_tokens_served(vllm_server.url) == served, "no request reached vLLM"

    # the same task under a limit its prompt fits runs as any job
    [fits] = api.post("/v1/jobs", json=answer_job(int(named[1]))).json()["job_ids"]
    done = wait_status(api, fits, timeout=300)
    assert done["status"] == "done", done.get("error")
    assert done["result"]["trajectory"]["prompt_length"] == int(named[1])
    assert prompt_tokens_served(vllm_server.url) > served
