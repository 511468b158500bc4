"""LLM backend faults under a real stack: a backend SIGKILLed mid-request, a backend that hangs.

The trajectory fails over to the other registered backend and the job ends `done`; with only
a hanging backend (which then leaves the pool) the job waits for another and ends `failed` with
`no_backend` after `backend_wait_s` (or `timed_out`, when the stage limit comes first), never stalls. Timeouts are small (ROLLOUTS_LLM_* below) so
each fault costs seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.stack import Stack
from shared.trajectory import Trajectory
from tests.reliability.agent_stack import (
    agent_stack,
    assert_worker_serves_next_job,
    assistant_backends,
    deregister_all,
    register,
    rollout_worker,
    submit,
    use_only,
)
from tests.reliability.backend_fixtures import SCRIPTS
from tests.reliability.fault_backends import HangingBackend, ScriptedProcess
from tests.support.scripted_llm import ScriptedLLM
from tests.support.waiting import client_for, wait_for, wait_status

REQUEST_TIMEOUT_S = 3.0
PROBE_TIMEOUT_S = 1.0
FAILOVERS = 2  # complete_routed's default: at most 3 backends a call
BACKEND_WAIT_S = 5.0
ENV = {
    "ROLLOUTS_LLM_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S),
    "ROLLOUTS_LLM_CONNECT_TIMEOUT_S": "1",
    "ROLLOUTS_LLM_MAX_RETRIES": "1",
    "ROLLOUTS_LLM_RETRY_BACKOFF_S": "0.1",
    "ROLLOUTS_LLM_PROBE_TIMEOUT_S": str(PROBE_TIMEOUT_S),
    "ROLLOUTS_BACKEND_WAIT_S": str(BACKEND_WAIT_S),
}
# The longest a generation call can take against backends that never answer: each of the
# FAILOVERS + 1 backends gets one request (read timeout) and one /health probe.
CALL_BOUND_S = (FAILOVERS + 1) * (REQUEST_TIMEOUT_S + PROBE_TIMEOUT_S)
# For the kill test: a request timeout no test step comes near, so only the kill ends the held request.
PATIENT_REQUEST_TIMEOUT_S = 600.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    with agent_stack(tmp_path_factory.mktemp("backend-faults"), model_dir, ENV) as started:
        yield started


@pytest.fixture()
def patient_stack(tmp_path: Path, model_dir: Path) -> Iterator[Stack]:
    """A stack of its own whose LLM requests wait far longer than any step of the test (registering
    the other backend on a busy machine included): a request ends by the backend's death, not a timeout."""
    env = {**ENV, "ROLLOUTS_LLM_REQUEST_TIMEOUT_S": str(PATIENT_REQUEST_TIMEOUT_S)}
    with agent_stack(tmp_path, model_dir, env) as started:
        yield started


@pytest.fixture()
def hanging(model_dir: Path) -> Iterator[HangingBackend]:
    backend = HangingBackend(model_dir)
    yield backend
    backend.stop()


def test_a_backend_killed_mid_request_fails_over_and_the_job_is_done(
    patient_stack: Stack, healthy: ScriptedLLM, model_dir: Path, figure
) -> None:
    """Turn 1 is served by A; A is SIGKILLed while it holds turn 2; B serves turn 2 from the same tokens."""
    stack = patient_stack
    api = client_for(stack)
    deregister_all(api)  # not the stack's own CPU backend: A, then B, are the pool
    doomed = ScriptedProcess.start(model_dir, SCRIPTS, serve=1)
    try:
        pid = rollout_worker(stack)
        doomed_id = register(api, doomed.url)
        job_id = submit(api, "two-turns")
        doomed.wait_received(2)  # turn 2 is in flight, held
        other_id = register(api, healthy.url)
        killed = time.monotonic()
        doomed.kill()
        # Well under the request timeout: a job still waiting then was not freed by the kill.
        record = wait_status(api, job_id, timeout=120)
        recovered = time.monotonic() - killed
    finally:
        doomed.kill()
    assert record["status"] == "done", record.get("error")
    assert record["result"]["reward"] == 1.0
    assert assistant_backends(record) == [doomed_id, other_id], "the trajectory moved on at turn 2"
    Trajectory.from_dict(record["result"]["trajectory"])  # one token record across both: every invariant holds
    dead = api.get(f"/v1/backends/{doomed_id}").json()
    assert not dead["healthy"] and dead["inflight"] == 0
    assert_worker_serves_next_job(stack, api, pid)
    figure(f"backend SIGKILLed mid-request: job done on the other backend {recovered:.1f} s after the kill")


def test_a_hanging_backend_fails_over_after_the_request_timeout(
    stack: Stack, api: httpx.Client, healthy: ScriptedLLM, hanging: HangingBackend, figure
) -> None:
    """The hanging backend takes the first request; after the read timeout and a failed probe the
    call moves to the healthy one, which serves the whole trajectory."""
    pid = rollout_worker(stack)
    hanging_id = register(api, hanging.url)
    job_id = submit(api, "two-turns")
    wait_for(hanging.completions, timeout=60, what="the generation request to reach the hanging backend")
    held = time.monotonic()
    other_id = register(api, healthy.url)
    record = wait_status(api, job_id, timeout=CALL_BOUND_S + 30)
    stuck = time.monotonic() - held
    assert record["status"] == "done", record.get("error")
    assert assistant_backends(record) == [other_id, other_id]
    assert not api.get(f"/v1/backends/{hanging_id}").json()["healthy"]
    assert_worker_serves_next_job(stack, api, pid)
    figure(
        f"hanging backend: job done {stuck:.1f} s after its request was taken "
        f"(request timeout {REQUEST_TIMEOUT_S:.0f} s + probe {PROBE_TIMEOUT_S:.0f} s)"
    )


@pytest.mark.parametrize(
    ("rollout_limit_s", "status"),
    [(60.0, "failed"), (1.5, "timed_out")],
    ids=["request-timeout-first", "stage-limit-first"],
)
def test_only_a_hanging_backend_ends_the_job_instead_of_stalling(
    stack: Stack,
    api: httpx.Client,
    healthy: ScriptedLLM,
    hanging: HangingBackend,
    figure,
    rollout_limit_s: float,
    status: str,
) -> None:
    """No backend ever answers: the job must still end, with a clear error, by whichever comes
    first of the LLM call's bound (request timeout + probe per backend) plus the wait for another
    backend (the hanging one fails its probe and leaves the pool), and the stage limit.
    The kind has no sandbox, so the stage limit is spent waiting on the backend alone."""
    pid = rollout_worker(stack)
    register(api, hanging.url)
    submitted = time.monotonic()
    job_id = submit(api, "after", kind="agent-finish", limits={"rollout_timeout_s": rollout_limit_s})
    bound = min(CALL_BOUND_S + BACKEND_WAIT_S, rollout_limit_s)
    record = wait_status(api, job_id, timeout=bound + 30)
    ended = time.monotonic() - submitted
    assert record["status"] == status, record
    if status == "failed":
        error = record["error"]
        assert error["stage"] == "rollout" and error["type"] == "no_backend", error
        assert "no LLM backend was open to this job" in error["message"]
        assert record["result"] is None
    else:
        assert record["partial"]["trajectory"]["counts"]["turns"] == 0
    use_only(api, healthy.url)
    assert_worker_serves_next_job(stack, api, pid)
    figure(
        f"only a hanging backend, rollout limit {rollout_limit_s:g} s: {status} {ended:.1f} s after submit "
        f"(bound {bound:.0f} s)"
    )
