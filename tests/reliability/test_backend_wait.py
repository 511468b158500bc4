"""Jobs wait for an LLM backend instead of failing: every backend draining, none registered yet,
or the job's own backend gone mid-rollout with no other open.

The job is handed back (no worker slot held), says `waiting for an LLM backend`, goes on once a
backend opens, and fails with a clear `no_backend` error only after `backend_wait_s`. Never a reward.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from shared.jobs.backend_wait import WAITING_DETAIL
from tests.reliability.agent_stack import (
    agent_stack,
    assistant_backends,
    deregister_all,
    register,
    rollout_worker,
    submit,
    use_only,
)
from tests.reliability.backend_fixtures import SCRIPTS
from tests.reliability.fault_backends import ScriptedProcess
from tests.support.scripted_llm import ScriptedLLM
from tests.support.waiting import client_for, job, wait_for, wait_status

ENV = {
    "ROLLOUTS_LLM_REQUEST_TIMEOUT_S": "3",
    "ROLLOUTS_LLM_CONNECT_TIMEOUT_S": "1",
    "ROLLOUTS_LLM_MAX_RETRIES": "1",
    "ROLLOUTS_LLM_RETRY_BACKOFF_S": "0.1",
    "ROLLOUTS_LLM_PROBE_TIMEOUT_S": "1",
    "ROLLOUTS_BACKEND_WAIT_S": "600",  # far beyond these tests: they must end by a backend, not by the wait
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    with agent_stack(tmp_path_factory.mktemp("backend-wait"), model_dir, ENV) as started:
        yield started


def waiting(api: httpx.Client, job_id: str, looks: int = 1) -> dict[str, Any] | None:
    """The job's record once it waits for a backend, after at least `looks` attempts at the rollout."""
    record = job(api, job_id)
    waits = record["status"] == "rollout" and record["status_detail"] == WAITING_DETAIL
    if waits and record["attempts"].get("rollout", 0) >= looks:
        return record
    assert record["status"] not in ("done", "failed", "timed_out", "cancelled"), record
    return None


def test_a_job_waits_while_every_backend_drains_and_goes_on_when_one_reopens(
    stack: Stack, api: httpx.Client, healthy: ScriptedLLM
) -> None:
    pid = rollout_worker(stack)
    backend_id = use_only(api, healthy.url)
    assert api.post(f"/v1/backends/{backend_id}/drain", json={"draining": True}).json()["draining"]
    job_id = submit(api, "after", kind="agent-finish")

    # It looks again and again (each look a fresh attempt handed back), and never fails meanwhile.
    record = wait_for(lambda: waiting(api, job_id, looks=3), timeout=90, what="the job to wait for a backend")
    assert record["error"] is None and record["lost"] == {}, record
    assert record["timings"]["rollout"]["waiting"] is not None
    (summary,) = api.get("/v1/jobs", params={"ids": job_id}).json()["jobs"]
    assert summary["status_detail"] == WAITING_DETAIL

    assert not api.post(f"/v1/backends/{backend_id}/drain", json={"draining": False}).json()["draining"]
    record = wait_status(api, job_id, timeout=90)
    assert record["status"] == "done", record.get("error")
    assert record["result"]["reward"] == 1.0 and record["status_detail"] is None
    assert assistant_backends(record) == [backend_id]
    assert rollout_worker(stack) == pid


def test_a_job_whose_backend_goes_away_mid_rollout_waits_and_runs_again_on_the_next(
    stack: Stack, api: httpx.Client, healthy: ScriptedLLM, model_dir: Path
) -> None:
    """Turn 1 on A; A is killed holding turn 2 and no other backend is open: the job waits, then
    its rollout runs again from the start on B, which registers later."""
    doomed = ScriptedProcess.start(model_dir, SCRIPTS, serve=1)
    try:
        use_only(api, doomed.url)
        job_id = submit(api, "two-turns")
        doomed.wait_received(2)
        doomed.kill()
        wait_for(lambda: waiting(api, job_id), timeout=90, what="the job to wait for a backend")
    finally:
        doomed.kill()
    other_id = register(api, healthy.url)
    record = wait_status(api, job_id, timeout=90)
    assert record["status"] == "done", record.get("error")
    assert record["result"]["reward"] == 1.0
    assert assistant_backends(record) == [other_id, other_id], "the rollout ran again, whole, on the new backend"


def test_a_job_that_finds_no_backend_for_backend_wait_s_fails_saying_so(tmp_path: Path, model_dir: Path) -> None:
    with agent_stack(tmp_path, model_dir, {**ENV, "ROLLOUTS_BACKEND_WAIT_S": "4"}) as stack:
        api = client_for(stack)
        deregister_all(api)
        job_id = submit(api, "after", kind="agent-finish")
        record = wait_status(api, job_id, timeout=120)
    assert record["status"] == "failed", record
    error = record["error"]
    assert error["stage"] == "rollout" and error["type"] == "no_backend", error
    assert "no LLM backend was open to this job" in error["message"] and "backend_wait_s = 4" in error["message"]
    assert record["result"] is None  # an infrastructure failure is never a reward
    assert record["attempts"]["rollout"] >= 2 and record["lost"] == {}


def test_a_stopping_worker_hands_back_a_rollout_held_in_an_llm_call_and_exits_without_waiting_for_the_call(
    tmp_path: Path, model_dir: Path
) -> None:
    """The backend holds the generation and never answers it; the drain interrupts the rollout,
    which abandons the call, and the worker exits (code 0) with the job handed back while that call
    is still pending, not at its request timeout (600 s here)."""
    holding = ScriptedProcess.start(model_dir, SCRIPTS, serve=0)
    env = {**ENV, "ROLLOUTS_LLM_REQUEST_TIMEOUT_S": "600", "ROLLOUTS_DRAIN_TIMEOUT_S": "0"}
    try:
        with agent_stack(tmp_path, model_dir, env) as stack:
            api = client_for(stack)
            use_only(api, holding.url)
            job_id = submit(api, "after", kind="agent-finish")
            holding.wait_received(1)
            (worker,) = stack.workers["rollout"]
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=120) == 0
            assert holding.process.poll() is None, "the call is still pending at the backend"
            record = job(api, job_id)
    finally:
        holding.kill()
    assert record["status"] == "rollout" and record["timings"]["rollout"].get("requeued"), record
    assert record["error"] is None
