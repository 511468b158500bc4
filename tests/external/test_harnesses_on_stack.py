"""Unmodified harnesses from the package registries, each run to its own end against a job's endpoint.

The stack is started as `rollouts up --backend-url` starts it, on a vLLM server of the tiny model
with a context long enough for the harnesses' own system prompts and tool schemas. Each job is an
ordinary math job with `"agent": "external"`; the harness talks to its endpoint only through the
settings a user would set. The tiny model writes nonsense: what is tested is that the harness ends
its run on its own terms, that every model call it made is one turn of one record, and that the
record is token-exact (it decodes to what the harness sent and its logprobs are vLLM's own).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.stack import Stack
from cli.vllm_server import VLLMServer
from shared.config import Settings
from shared.trajectory import ASSISTANT, Trajectory
from tests.external.conftest import renderer_for
from tests.external.harnesses import run_claude_code, run_codex, run_mini_swe_agent
from tests.external.test_agent_formats import common_token_ids
from tests.on_vllm.test_rollouts_on_vllm import recomputed_logprobs
from tests.support.trajectory_checks import (
    assert_every_conversation_ended,
    recorded_calls,
    segments_of,
    tokens_billed,
)
from tests.support.vllm_server import LONG_CONTEXT
from tests.support.waiting import client_for, wait_status

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from external_agent import wait_until_serving

pytestmark = pytest.mark.vllm

ENV = {
    "ROLLOUTS_HEARTBEAT_INTERVAL_S": "1",
    "ROLLOUTS_LLM_HEARTBEAT_INTERVAL_S": "1",
    "ROLLOUTS_AGENT_MAX_CONTEXT_TOKENS": str(LONG_CONTEXT),
}


@pytest.fixture(scope="module")
def stack(long_context_vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("harness-stack")
    stack = Stack(
        Settings(redis_url=None, state_dir=tmp_path / "state"),
        api_port=0,
        concurrency={"init": 1, "rollout": 2, "eval": 1},
        log_dir=tmp_path / "logs",
        backend_urls=[long_context_vllm_server.url],
        extra_env=ENV,
    )
    stack.start()
    stack.wait_for_workers()
    yield stack
    stack.stop(timeout=20)


def submit(stack: Stack, sampling: dict[str, Any], max_turns: int = 16) -> tuple[str, dict[str, str]]:
    """One math job driven from outside, with the whole long context; its id and its endpoint."""
    job = {
        "task": {"kind": "math", "problem": "What is 2 + 3?", "answer": "5"},
        "agent": "external",
        "limits": {"max_turns": max_turns, "max_tokens": LONG_CONTEXT, "rollout_timeout_s": 900},
        "sampling": sampling,
    }
    body = client_for(stack).post("/v1/jobs", json=job).json()
    return body["job_ids"][0], body["agent"][0]


def evaluated_record(stack: Stack, job_id: str) -> Trajectory:
    """The job's record once evaluated: done, with a reward, every invariant of the record checked."""
    record = wait_status(client_for(stack), job_id, timeout=600)
    assert record["status"] == "done", record.get("error")
    assert isinstance(record["result"]["reward"], (int, float)) and record["result"]["evaluation"]
    return Trajectory.from_dict(record["result"]["trajectory"])  # validates every invariant


def assert_logprobs_are_vllms(trajectory: Trajectory, server: VLLMServer) -> None:
    """Every generated token's logprob, in every segment, is vLLM's own for that exact prefix: the record is what
    the model saw."""
    for segment in segments_of(trajectory):
        recomputed = recomputed_logprobs(server.url, segment.token_ids)
        assistant = [t for t in segment.turns if t.role == ASSISTANT]
        worst = max(abs(segment.logprobs[i] - recomputed[i]) for t in assistant for i in range(t.start, t.end))
        assert worst < 1e-3, f"the record is not what the model saw: max |logprob diff| {worst}"


def assert_the_harness_is_in_the_record(trajectory: Trajectory, server: VLLMServer, calls: int | None = None) -> None:
    """What the service guarantees whatever a harness decides: every call it made is in the record (`calls`, the
    harness's own count where it gives one), every conversation ended with the rollout, every token is vLLM's."""
    recorded = recorded_calls(trajectory)
    assert recorded and (calls is None or len(recorded) == calls), (len(recorded), calls)
    assert_every_conversation_ended(trajectory)
    assert_logprobs_are_vllms(trajectory, server)


def answering_segment(trajectory: Trajectory, answer: str) -> Trajectory:
    """The segment whose last call gave the harness's final answer (the harness may have made side calls)."""
    last = max(recorded_calls(trajectory), key=lambda call: call[1].call or 0)[0]
    assert last.final_text == answer, "its answer is its last call's reply"
    return last


def finish(stack: Stack, endpoint: dict[str, str]) -> None:
    """What the harness cannot know to do: end the rollout, so the job goes to evaluation."""
    headers = {"Authorization": f"Bearer {endpoint['api_key']}"}
    assert client_for(stack).post(f"{endpoint['base_url']}/finish", headers=headers).status_code == 200


def test_mini_swe_agent_runs_to_its_own_end_and_each_call_is_a_token_exact_segment(
    stack: Stack, long_context_vllm_server: VLLMServer, tokenizer: Any, tmp_path: Path
) -> None:
    stopping = {"max_tokens": 48, "seed": 5, "stop_token_ids": common_token_ids(tokenizer)}
    job_id, endpoint = submit(stack, stopping)
    wait_until_serving(endpoint)
    saved = run_mini_swe_agent(endpoint["base_url"], endpoint["api_key"], "tiny", "What is 2 + 3?", tmp_path)
    assert saved["info"]["exit_status"] in MINI_SWE_AGENT_ENDS, saved["info"]  # its own end, whichever it chose
    finish(stack, endpoint)
    trajectory = evaluated_record(stack, job_id)
    assert_the_harness_is_in_the_record(trajectory, long_context_vllm_server, saved["info"]["model_stats"]["api_calls"])
    # what litellm was told each call used (kept in mini-swe-agent's messages) adds up to the record
    usages = [m["extra"]["response"]["usage"] for m in saved["messages"] if m.get("extra", {}).get("response")]
    assert sum(u["prompt_tokens"] + u["completion_tokens"] for u in usages) == tokens_billed(trajectory)
    # what it sent, token for token: each call's prompt renders the messages mini-swe-agent held before that call
    sent = [{k: v for k, v in m.items() if k in SENT} for m in saved["messages"] if m["role"] != "exit"]
    renderer = renderer_for(tokenizer, [BASH_TOOL])
    for segment, turn in recorded_calls(trajectory):
        assert renderer.decode(segment.token_ids[: turn.start]) in {
            renderer.render(renderer.prepare(sent[:n]), add_generation_prompt=True) for n in range(2, len(sent) + 1)
        }, "a call's prompt is not a conversation mini-swe-agent held"


def test_codex_exec_runs_its_turn_to_its_end_on_the_responses_route(
    stack: Stack, long_context_vllm_server: VLLMServer, tokenizer: Any, tmp_path: Path
) -> None:
    # stopping on common tokens: a turn cut at max_output_tokens is `incomplete`, which Codex takes as a failure
    job_id, endpoint = submit(stack, {"max_tokens": 32, "seed": 5, "stop_token_ids": common_token_ids(tokenizer)})
    wait_until_serving(endpoint)
    events = run_codex(endpoint["base_url"], endpoint["api_key"], "tiny", "What is 2 + 3?", tmp_path)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "thread.started" and kinds[-1] == "turn.completed", kinds
    usage = events[-1]["usage"]
    finish(stack, endpoint)
    trajectory = evaluated_record(stack, job_id)
    assert_the_harness_is_in_the_record(trajectory, long_context_vllm_server)
    # what Codex was told it used, over all its calls, is the record: its ~25k-token prompts and what the model wrote
    assert usage["input_tokens"] + usage["output_tokens"] == tokens_billed(trajectory)
    said = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    segment = answering_segment(trajectory, said[-1]) if said else segments_of(trajectory)[-1]
    prompt = tokenizer.decode(segment.token_ids[: segment.turns[1].start])
    assert "What is 2 + 3?" in prompt and "exec_command" in prompt, "its own prompt and tools, as it sent them"


def test_claude_code_print_mode_runs_to_its_end_on_the_messages_route(
    stack: Stack, long_context_vllm_server: VLLMServer, tokenizer: Any, tmp_path: Path
) -> None:
    job_id, endpoint = submit(stack, {"max_tokens": 32, "seed": 5, "stop_token_ids": common_token_ids(tokenizer)})
    wait_until_serving(endpoint)
    result = run_claude_code(endpoint["base_url"], endpoint["api_key"], "tiny", "What is 2 + 3?", tmp_path)
    assert result["is_error"] is False and result["terminal_reason"] == "completed", result
    finish(stack, endpoint)
    trajectory = evaluated_record(stack, job_id)
    assert_the_harness_is_in_the_record(trajectory, long_context_vllm_server)
    # what Claude Code was told it used, over every call it made (its side calls too), is the record
    billed = sum(u["inputTokens"] + u["outputTokens"] for u in result["modelUsage"].values())
    assert billed == tokens_billed(trajectory), result["modelUsage"]
    segment = answering_segment(trajectory, result["result"])
    prompt = tokenizer.decode(segment.token_ids[: segment.turns[1].start])
    assert "What is 2 + 3?" in prompt and '"name": "Bash"' in prompt, "its own prompt and tools, as it sent them"


# mini-swe-agent's own ends of a run (minisweagent.agents.default): a submission, its step, cost or time limit, or
# the third reply in a row it could not parse (what the tiny model's nonsense usually gives)
MINI_SWE_AGENT_ENDS = {"Submitted", "LimitsExceeded", "TimeExceeded", "RepeatedFormatError"}
SENT = ("role", "content", "tool_calls", "tool_call_id")  # what of its saved messages it sends to the model


BASH_TOOL = {  # mini-swe-agent's tool (minisweagent.models.utils.actions_toolcall.BASH_TOOL), as it sends it
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
            "required": ["command"],
        },
    },
}
