"""Workers that die or are stopped mid-job: nothing is lost, nothing runs twice to completion."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support.waiting import client_for, trace, wait_for, wait_status


def _running_pid(trace_dir, job_id: str, stage: str) -> int:
    line = wait_for(
        lambda: next((line for line in trace(trace_dir, job_id) if line.startswith(f"{stage} start attempt=1")), None),
        what=f"{stage} to start",
    )
    return int(line.rsplit("pid=", 1)[1])


@pytest.mark.parametrize("stage", ["init", "rollout", "eval"])
def test_a_job_whose_worker_is_killed_is_picked_up_again_and_finishes(make_stack, trace_dir, stage):
    stack = make_stack()
    stack.start_worker(stage)  # a second worker of the stage to take the job over
    stack.wait_for_workers()
    api = client_for(stack)
    job = {
        "task": {"kind": "scripted", "trace": str(trace_dir), "sleep": {stage: 60}, "sleep_first_attempt_only": True}
    }
    job_id = api.post("/v1/jobs", json=job).json()["job_ids"][0]

    pid = _running_pid(trace_dir, job_id, stage)
    os.kill(pid, signal.SIGKILL)
    record = wait_status(api, job_id, timeout=90)

    assert record["status"] == "done", record
    assert record["attempts"][stage] == 2
    assert record["lost"] == {stage: 1}
    lines = trace(trace_dir, job_id)
    second = [line for line in lines if line.startswith(f"{stage} start attempt=2")]
    assert len(second) == 1 and f"pid={pid}" not in second[0]
    assert sum(line.startswith("eval end") for line in lines) == 1, "the job completed more than once"


def test_a_job_whose_worker_dies_with_no_retries_left_fails_with_a_reason(make_stack, trace_dir):
    stack = make_stack(env={"ROLLOUTS_STAGE_RETRIES": "0"})
    api = client_for(stack)
    job = {"task": {"kind": "scripted", "trace": str(trace_dir), "sleep": {"rollout": 60}}}
    job_id = api.post("/v1/jobs", json=job).json()["job_ids"][0]

    os.kill(_running_pid(trace_dir, job_id, "rollout"), signal.SIGKILL)
    record = wait_status(api, job_id, timeout=90)

    assert record["status"] == "failed"
    assert record["error"]["type"] == "worker_lost" and record["error"]["stage"] == "rollout"
    # The job end removes the workspace just after the status move that the API shows.
    wait_for(lambda: not (stack.settings.workspaces / job_id).exists(), timeout=30, what="the workspace to go")


@pytest.mark.parametrize("crashes", [False, True], ids=["stops-cleanly", "crashes-while-stopping"])
def test_sigterm_hands_running_jobs_back_to_the_queue(make_stack, trace_dir, crashes):
    stack = make_stack(env={"ROLLOUTS_DRAIN_TIMEOUT_S": "1"})
    api = client_for(stack)
    task = {"kind": "scripted", "trace": str(trace_dir), "sleep": {"rollout": 60}, "sleep_first_attempt_only": True}
    job = {"task": {**task, "crash_when_interrupted": crashes}}
    job_id = api.post("/v1/jobs", json=job).json()["job_ids"][0]
    _running_pid(trace_dir, job_id, "rollout")
    draining = stack.workers["rollout"][0]

    draining.send_signal(signal.SIGTERM)
    assert draining.wait(timeout=30) == 0
    stack.start_worker("rollout")  # the job waits in the queue for the next worker
    record = wait_status(api, job_id, timeout=60)

    assert record["status"] == "done"
    assert record["attempts"]["rollout"] == 2
    assert "requeued" in record["timings"]["rollout"]
    assert any(line.startswith("rollout cleanup attempt=1") for line in trace(trace_dir, job_id))
