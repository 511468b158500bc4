"""Tool calls reach NeMo Gym as its function-call items (nemo-gym 0.4.0's server and client, as in
test_nemo_gym_agent.py).

The tiny random model never writes a valid tool call, so this stack's backend is the scripted test double of vLLM
(tests/support/scripted_llm.py: real tokenizer, vLLM's token-in/token-out API); the service, NeMo Gym's CLI, server
and rollout client are real. A turn that calls an unknown tool and one that calls `finish`, each with prose beside
the call, become: the prose as an assistant message without tokens, the call as a `function_call` item carrying the
turn's tokens, and the call's output as a `function_call_output`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from cli.embedded_redis import free_port
from cli.stack import Stack
from rollouts_client import RolloutClient
from shared.config import Settings
from tests.support.scripted_llm import ScriptedLLM
from tests.support.trainers_env import nemo_gym_python
from tests.trainers.conftest import run_driver
from tests.trainers.test_nemo_gym_agent import assert_log_is_record, nemo_rl_message_log

pytestmark = [pytest.mark.slow]


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> Iterator[ScriptedLLM]:
    server = ScriptedLLM(AutoTokenizer.from_pretrained(tiny_model)).start()
    server.scripts["tools"] = [
        "Let me look it up. " + call("lookup", query="2 + 2"),
        "It is 4. " + call("finish", answer="\\boxed{4}"),
    ]
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedLLM) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("nemo-gym-tools")
    env = {
        "ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds",
        "ROLLOUTS_LLM_HEARTBEAT_TIMEOUT_S": "600",  # the scripted backend does not beat
    }
    stack = Stack(
        Settings(redis_url=None, state_dir=root / "state"),
        api_port=0,
        concurrency={"init": 1, "rollout": 2, "eval": 1},
        log_dir=root / "logs",
        extra_env=env,
    )
    try:
        stack.start()
        stack.wait_for_workers()
        with RolloutClient(stack.api_url) as client:
            client.register_backend(llm.url, model=llm.model)
        yield stack
    finally:
        stack.stop(timeout=10)


def test_tool_calls_are_function_call_items_with_the_turns_tokens(
    stack: Stack, tiny_model: Path, tmp_path: Path
) -> None:
    row = {
        "agent_ref": {"name": "rollouts_agent"},
        "rollouts_task": {"kind": "agent-answer", "problem": "What is 2 + 2? [script:tools]", "answer": "4"},
        "responses_create_params": {"input": [], "max_output_tokens": 100},
    }
    given = {"head_port": free_port(), "unreachable_url": f"http://127.0.0.1:{free_port()}", "rows": {"tools": row}}
    out = run_driver("nemo_gym_driver.py", tiny_model, given, stack.api_url, tmp_path, python=nemo_gym_python())
    answer = out["tools"]
    assert answer["status"] == 200, answer
    result, output = answer["result"], answer["result"]["response"]["output"]
    with RolloutClient(stack.api_url) as client:
        job = client.get_job(result["rollouts_job_id"])
    record = job.trajectory
    assert result["reward"] == job.reward and record["stop_reason"] == "finish"
    assert answer["item_classes"] == [
        "NeMoGymResponseOutputMessage",
        "NeMoGymResponseFunctionToolCallForTraining",
        "NeMoGymFunctionCallOutput",
        "NeMoGymResponseOutputMessage",
        "NeMoGymResponseFunctionToolCallForTraining",
        "NeMoGymFunctionCallOutput",
    ]
    assert_log_is_record(nemo_rl_message_log(output), record)
    calls = [t["tool_calls"][0] for t in record["turns"] if t["role"] == "assistant"]
    items = [output[1], output[4]]
    assert [i["name"] for i in items] == ["lookup", "finish"]
    assert [json.loads(i["arguments"]) for i in items] == [c["arguments"] for c in calls]
    assert [output[2]["call_id"], output[5]["call_id"]] == [i["call_id"] for i in items] == ["call00001", "call00002"]
    assert output[2]["output"] == calls[0]["output"] and output[2]["output"].startswith("Error: unknown tool")
    assert output[5]["output"] == calls[1]["output"] == "Finished."
    assert [output[0]["content"][0]["text"], output[3]["content"][0]["text"]] == ["Let me look it up.", "It is 4."]
