"""mini-swe-agent's `mini` CLI, unmodified, with its commands run in the job's sandbox (mini_swe_agent_env.py).

The tiny random model never calls a tool, so the calls here are scripted by the suite's test double
of a vLLM backend (tests/support/scripted_llm.py): the agent runs `ls` through the job's bash tool,
then submits the way mini-swe-agent submits (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`). The
same CLI against real vLLM through the whole stack is in test_harnesses_on_stack.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.external.conftest import Endpoint, renderer_for, serve
from tests.external.harnesses import run_mini_swe_agent
from tests.external.test_harnesses_on_stack import BASH_TOOL
from tests.support.scripted_llm import SCRIPTED_MODEL, ScriptedLLM
from tests.support.trajectory_checks import (
    assert_calls_exact_against_backend,
    assert_decodes_to_conversation,
    assert_every_conversation_ended,
    recorded_calls,
)
from workers.sandbox import Sandbox


def bash_call(command: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'bash', 'arguments': {'command': command}})}</tool_call>"


SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.fixture()
def endpoint(tokenizer: Any, job_sandbox: Sandbox) -> Iterator[Endpoint]:
    script = [f"Let me look.\n{bash_call('echo hello > a.txt && ls')}", bash_call(SUBMIT)]
    llm = ScriptedLLM(tokenizer, scripts={"mini": script}).start()
    yield from serve(tokenizer, llm.url, SCRIPTED_MODEL, job_sandbox, max_tokens_per_turn=200)
    llm.stop()


def test_mini_swe_agent_runs_its_commands_in_the_jobs_sandbox_and_submits(
    endpoint: Endpoint, tokenizer: Any, tmp_path: Path
) -> None:
    saved = run_mini_swe_agent(
        endpoint.url, endpoint.key, SCRIPTED_MODEL, "List the files. [script:mini]", tmp_path, max_tokens=200
    )
    assert saved["info"]["exit_status"] == "Submitted", saved["info"]
    observation = json.loads(next(m["content"] for m in saved["messages"] if m["role"] == "tool"))
    assert observation == {"returncode": 0, "output": "a.txt\n"}, "mini.yaml's observation of the sandbox's run"
    assert not (tmp_path / "a.txt").exists(), "the command ran in the job's sandbox, not where mini runs"
    finished = httpx.post(
        f"{endpoint.url}/finish", json={"answer": saved["info"]["submission"]}, headers=auth(endpoint)
    )
    assert finished.status_code == 200
    record = endpoint.session.record()
    assert_calls_exact_against_backend(record, endpoint.served)
    assert len(recorded_calls(record)) == saved["info"]["model_stats"]["api_calls"], "every call it made"
    assert_every_conversation_ended(record)
    assert record.counts.tool_calls == 2, "both of its bash calls are in the record"
    runs = record.extra["tool_runs"]
    assert [r["arguments"]["command"] for r in runs] == ["echo hello > a.txt && ls", SUBMIT]
    task = [{"role": m["role"], "content": m["content"]} for m in saved["messages"][:2]]
    assert_decodes_to_conversation(record, renderer_for(tokenizer, [BASH_TOOL]), task)


@pytest.fixture()
def bashless(tokenizer: Any, job_sandbox: Sandbox) -> Iterator[Endpoint]:
    """A job whose tools do not include bash: its endpoint refuses `tools/bash` (404, naming its tools)."""
    llm = ScriptedLLM(tokenizer, scripts={"mini": [bash_call("ls")]}).start()
    yield from serve(
        tokenizer, llm.url, SCRIPTED_MODEL, job_sandbox, max_tokens_per_turn=200, allowed_tools=("python",)
    )
    llm.stop()


def test_a_refused_command_is_the_agents_observation_and_its_run_goes_on_to_its_step_limit(
    bashless: Endpoint, tokenizer: Any, tmp_path: Path
) -> None:
    saved = run_mini_swe_agent(
        bashless.url, bashless.key, SCRIPTED_MODEL, "[script:mini]", tmp_path, step_limit=2, max_tokens=200
    )
    assert saved["info"]["exit_status"] == "LimitsExceeded"
    observations = [json.loads(m["content"]) for m in saved["messages"] if m["role"] == "tool"]
    assert observations and all(o["returncode"] == -1 for o in observations)
    assert all("The job's bash tool failed: 404" in o["exception_info"] for o in observations)
    assert all("no tool 'bash' in this job" in o["output"] for o in observations), "the refusal, as the job said it"
    record = bashless.session.record()
    assert bashless.session.tool_runs == [], "nothing ran"
    assert_calls_exact_against_backend(record, bashless.served)
    assert len(recorded_calls(record)) == saved["info"]["model_stats"]["api_calls"], "every call it made"


def auth(endpoint: Endpoint) -> dict[str, str]:
    return {"Authorization": f"Bearer {endpoint.key}"}
