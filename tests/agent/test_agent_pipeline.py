"""An agentic kind through the real stack: API, init/rollout/eval workers, the pool, a sandbox per job."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from cli.stack import Stack
from shared.config import Settings
from shared.trajectory import Trajectory
from tests.support.scripted_llm import ScriptedLLM
from tests.support.waiting import client_for, job, wait_for, wait_status


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def llm(tokenizer: Any) -> Iterator[ScriptedLLM]:
    server = ScriptedLLM(tokenizer).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path, llm: ScriptedLLM) -> Iterator[Stack]:
    """One stack for the module: starting processes that import transformers is the slow part."""
    tmp_path = tmp_path_factory.mktemp("agent-stack")
    settings = Settings(redis_url=None, state_dir=tmp_path / "state")
    env = {
        "ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds",
        "ROLLOUTS_LLM_HEARTBEAT_TIMEOUT_S": "600",  # the scripted backend does not beat
        "ROLLOUTS_HEARTBEAT_INTERVAL_S": "1",
    }
    stack = Stack(
        settings, api_port=0, concurrency={"init": 1, "rollout": 2, "eval": 1}, log_dir=tmp_path / "logs", extra_env=env
    )
    stack.start()
    stack.wait_for_workers()
    assert client_for(stack).post("/v1/backends", json={"url": llm.url, "model": llm.model}).status_code == 201
    yield stack
    stack.stop(timeout=10)


@pytest.fixture()
def scripted(llm: ScriptedLLM) -> Iterator[ScriptedLLM]:
    llm.exchanges.clear()
    llm.received = 0
    yield llm
    for gate in llm.gates.values():  # never leave a request held
        gate.set()


def submit(stack: Stack, script: str, **task: Any) -> str:
    body = {
        "task": {"kind": "agent-echo", "prompt": f"Echo the input. [script:{script}]", **task},
        "limits": {"max_turns": 6, "max_tokens": 3000},
        "sampling": {"max_tokens": 300},
    }
    return client_for(stack).post("/v1/jobs", json=body).json()["job_ids"][0]


def test_an_agent_job_runs_tools_in_its_sandbox_and_is_scored(stack: Stack, scripted: ScriptedLLM) -> None:
    scripted.scripts["echo"] = [
        call("bash", command="cat input.txt && echo written > out.txt"),
        "The input says hello. " + call("finish", answer="hello"),
    ]
    job_id = submit(stack, "echo", input="hello from init", expected="hello")
    api = client_for(stack)
    record = wait_status(api, job_id, timeout=120)
    assert record["status"] == "done", record.get("error")
    assert record["result"]["reward"] == 1.0

    trajectory = Trajectory.from_dict(record["result"]["trajectory"])  # validates every invariant
    assert trajectory.stop_reason == "finish" and trajectory.answer == "hello"
    assert trajectory.extra == {"out": "written"}, "collect ran while the sandbox was up"
    assert "hello from init" in trajectory.turns[2].text, "the observation is the tool's real output"
    assert trajectory.turns[1].model == "scripted-policy-v1" and trajectory.turns[1].policy_version == "1"
    assert [e.token_ids for e in scripted.exchanges] == [
        trajectory.token_ids[t.start : t.end] for t in trajectory.turns if t.role == "assistant"
    ]
    # The same record over HTTP as msgpack.
    packed = api.get(f"/v1/jobs/{job_id}", headers={"Accept": "application/msgpack"})
    assert packed.headers["content-type"].startswith("application/msgpack")
    assert Trajectory.from_dict(msgpack.unpackb(packed.content)["result"]["trajectory"]) == trajectory
    assert api.get("/v1/backends").json()["backends"][0]["inflight"] == 0, "the pin was released"


def test_jobs_take_ready_sandboxes_from_the_rollout_workers_pool(stack: Stack, scripted: ScriptedLLM) -> None:
    """The first job of a profile starts its sandbox; the pool then keeps one ready, and a later job takes
    it instead of starting one on its critical path (the rollout worker says which, in its log)."""
    scripted.scripts["pooled"] = [
        call("bash", command="cat input.txt && echo written > out.txt"),
        call("finish", answer="hello"),
    ]
    api = client_for(stack)
    logs = stack.log_dir
    assert logs is not None

    def said(text: str) -> int:
        return sum(path.read_text(errors="replace").count(text) for path in logs.glob("rollout-*.log"))

    for _ in range(5):  # until a job finds the ready one (the refill runs beside the jobs, not in step)
        record = wait_status(api, submit(stack, "pooled", input="hello from init", expected="hello"), timeout=120)
        assert record["status"] == "done", record.get("error")
        assert record["result"]["reward"] == 1.0
        assert record["result"]["trajectory"]["extra"] == {"out": "written"}, "the job's files were in its sandbox"
        if said("ready from the pool"):
            break
    assert said("ready from the pool") >= 1


def test_cancelling_mid_tool_call_keeps_the_partial_trajectory(stack: Stack, scripted: ScriptedLLM) -> None:
    scripted.scripts["stuck"] = [call("bash", command="sleep 120")]
    job_id = submit(stack, "stuck")
    api = client_for(stack)
    wait_for(lambda: len(scripted.exchanges) == 1, timeout=60, what="the first turn")
    assert api.delete(f"/v1/jobs/{job_id}").status_code == 200
    partial = wait_for(lambda: job(api, job_id)["partial"], timeout=60, what="the partial record")
    trajectory = Trajectory.from_dict(partial["trajectory"])
    assert trajectory.stop_reason == "cancelled" and trajectory.counts.turns == 1
    assert job(api, job_id)["status"] == "cancelled"


def test_cancelling_mid_generation_does_not_wait_for_the_backend(stack: Stack, scripted: ScriptedLLM) -> None:
    scripted.scripts["hang"] = [call("finish", answer="never")]
    scripted.gates["hang"] = threading.Event()  # the backend holds the request until the test lets go
    job_id = submit(stack, "hang")
    api = client_for(stack)
    wait_for(lambda: scripted.received == 1, timeout=60, what="the request to reach the backend")
    assert api.delete(f"/v1/jobs/{job_id}").status_code == 200
    partial = wait_for(lambda: job(api, job_id)["partial"], timeout=60, what="the partial record")
    assert not scripted.gates["hang"].is_set(), "the rollout stopped while its generation was still held"
    trajectory = Trajectory.from_dict(partial["trajectory"])
    assert trajectory.stop_reason == "cancelled" and trajectory.counts.turns == 0
    scripted.gates["hang"].set()
    wait_for(
        lambda: api.get("/v1/backends").json()["backends"][0]["inflight"] == 0,
        timeout=30,
        what="the abandoned call to release its pin",
    )


def test_a_model_whose_tokenizer_the_workers_cannot_read_fails_as_infrastructure(
    stack: Stack, scripted: ScriptedLLM, tmp_path: Path
) -> None:
    """Never another model's tokenizer, never a reward: the job fails naming the model and the path."""
    api = client_for(stack)
    [original] = api.get("/v1/backends").json()["backends"]
    missing = tmp_path / "no-tokenizer-here"
    registered = api.post(
        "/v1/backends", json={"url": scripted.url, "model": scripted.model, "tokenizer": str(missing)}
    )
    assert registered.status_code == 201 and registered.json()["tokenizer"] == str(missing)
    try:
        scripted.scripts["lost"] = [call("finish", answer="x")]
        record = wait_status(api, submit(stack, "lost"), timeout=120)
        assert record["status"] == "failed" and record.get("result") is None
        assert record["error"]["type"] == "TokenizerUnavailable"
        assert str(missing) in record["error"]["message"] and scripted.model in record["error"]["message"]
        assert scripted.exchanges == [], "nothing was generated with a tokenizer that is not the model's"
    finally:
        api.post(
            "/v1/backends", json={"url": scripted.url, "model": scripted.model, "tokenizer": original["tokenizer"]}
        )
