"""An agentic stack for fault tests: real workers, sandboxes and tool server, a scripted LLM.

The jobs are `agent-echo` (bash, finish) or `agent-tools` (bash, python, finish) from
tests.support.agent_kinds and tests.reliability.fault_kinds; what the agent does each turn
comes from a ScriptedLLM script named in the prompt.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from cli.stack import Stack
from shared.config import Settings
from tests.support.proc_table import process_table
from tests.support.scripted_llm import SCRIPTED_MODEL, ScriptedLLM
from tests.support.waiting import client_for, wait_for, wait_status

AGENT_ENV = {
    "ROLLOUTS_TASK_MODULES": "tests.support.agent_kinds,tests.reliability.fault_kinds",
    "ROLLOUTS_LLM_HEARTBEAT_TIMEOUT_S": "600",  # scripted backends do not beat
    "ROLLOUTS_HEARTBEAT_INTERVAL_S": "1",
    "ROLLOUTS_MAINTENANCE_INTERVAL_S": "2",
    "ROLLOUTS_SANDBOX_REQUIRE_ISOLATION": "true",
}


@contextmanager
def agent_stack(tmp_path: Path, model_dir: Path, env: dict[str, str]) -> Iterator[Stack]:
    """One stack with one rollout worker process (so "the same worker" is one pid)."""
    settings = Settings(redis_url=None, state_dir=tmp_path / "state")
    stack = Stack(
        settings,
        api_port=0,
        concurrency={"init": 1, "rollout": 2, "eval": 1},
        log_dir=tmp_path / "logs",
        extra_env={**AGENT_ENV, **env},
    )
    stack.start()
    try:
        stack.wait_for_workers()
        yield stack
    finally:
        stack.stop(timeout=10)


@contextmanager
def scripted_agent_stack(
    base: Path, model_dir: Path, env: dict[str, str], scripts: dict[str, list[str]], tokenizer: Any
) -> Iterator[Stack]:
    """agent_stack whose one LLM backend is a ScriptedLLM playing `scripts` (a module's fault stack)."""
    llm = ScriptedLLM(tokenizer, scripts=dict(scripts)).start()
    try:
        with agent_stack(base, model_dir, env) as stack:
            use_only(client_for(stack), llm.url)
            yield stack
    finally:
        llm.stop()


def call(name: str, **arguments: Any) -> str:
    """One tool call as the hermes parser reads it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def submit(
    api: httpx.Client, script: str, kind: str = "agent-echo", limits: dict[str, Any] | None = None, **task: Any
) -> str:
    body = {
        "task": {"kind": kind, "prompt": f"Do it. [script:{script}]", "expected": "ok", **task},
        "limits": {"max_turns": 8, "max_tokens": 3000, **(limits or {})},
        "sampling": {"max_tokens": 300},
    }
    response = api.post("/v1/jobs", json=body)
    response.raise_for_status()
    return response.json()["job_ids"][0]


def register(api: httpx.Client, url: str) -> str:
    response = api.post("/v1/backends", json={"url": url, "model": SCRIPTED_MODEL})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def deregister_all(api: httpx.Client) -> None:
    for backend in api.get("/v1/backends").json()["backends"]:
        api.delete(f"/v1/backends/{backend['id']}")


def use_only(api: httpx.Client, url: str) -> str:
    """Make `url` the pool's only backend (the stack's own CPU backend included); returns its id."""
    deregister_all(api)
    return register(api, url)


def rollout_worker(stack: Stack) -> int:
    (process,) = stack.workers["rollout"]
    assert process.poll() is None, "the rollout worker died"
    return process.pid


def ran_on(record: dict[str, Any], stage: str) -> int:
    """The pid of the worker process that ran the stage (slot names are <stage>.<host>.<pid>.<slot>)."""
    return int(record["workers"][stage].rsplit(".", 2)[-2])


def assert_worker_serves_next_job(stack: Stack, api: httpx.Client, pid: int) -> None:
    """The same rollout worker process is alive and runs the next job to done."""
    assert rollout_worker(stack) == pid
    job_id = submit(api, "after", kind="agent-echo")
    record = wait_status(api, job_id, timeout=90)
    assert record["status"] == "done", record.get("error")
    assert ran_on(record, "rollout") == pid


def assistant_backends(record: dict[str, Any]) -> list[str]:
    turns = record["result"]["trajectory"]["turns"]
    return [turn["backend_id"] for turn in turns if turn["role"] == "assistant"]


def observations(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """Every tool call of the trajectory with what it returned."""
    return [c for t in trajectory["turns"] if t["role"] == "assistant" for c in t.get("tool_calls", [])]


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _group) in process_table().items():
        children.setdefault(parent, []).append(pid)
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def argv_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def find_process(root: int, program: str, *needles: str, timeout: float = 60.0) -> int:
    """The one descendant of `root` running `program` with every needle in its argv (waits for it).

    By program too, because bwrap and its pid-namespace init carry the sandboxed argv in theirs.
    """

    def matches(pid: int) -> bool:
        argv = argv_of(pid)
        return bool(argv) and os.path.basename(argv[0]).startswith(program) and all(n in argv for n in needles)

    def found() -> int | None:
        pids = [p for p in descendants(root) if matches(p)]
        return pids[0] if len(pids) == 1 else None

    return wait_for(found, timeout=timeout, what=f"a process {program} {needles}")


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
