"""Sandbox faults during a job, under a real stack with bubblewrap sandboxes and the real tool server.

Each fault either fails the job with a clear error (the sandbox itself is gone: an infrastructure
fault, not the policy's) or becomes an error observation the agent sees and the job goes on (the
agent's own environment misbehaved within its limits). Either way the rollout worker process lives
on and runs the next job.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from shared.config import Settings
from shared.jobs.spec import JobRequest
from shared.tasks.context import StageContext, StageInterrupted
from tests.reliability.agent_stack import (
    argv_of,
    assert_worker_serves_next_job,
    call,
    find_process,
    kill,
    observations,
    rollout_worker,
    scripted_agent_stack,
    submit,
)
from tests.reliability.fault_kinds import ToolsAgentKind
from tests.support.waiting import client_for, wait_for, wait_status
from workers.sandbox import SandboxError
from workers.toolserver.reaper import children

FILE_SIZE_BYTES = 1024 * 1024
DISK_BYTES = 16 * 1024 * 1024
ENV = {
    "ROLLOUTS_SANDBOX_FILE_SIZE_BYTES": str(FILE_SIZE_BYTES),
    "ROLLOUTS_SANDBOX_DISK_BYTES": str(DISK_BYTES),
    # These find the job's tool server as the rollout worker's only one; a pool's ready sandboxes would be
    # more (the pool has its own tests: tests/sandbox/test_pool*.py, tests/agent/test_agent_pipeline.py).
    "ROLLOUTS_SANDBOX_POOL": "false",
}
FINISH = "Done. " + call("finish", answer="ok")
SCRIPTS = {
    "after": [FINISH],
    "server-dies": [call("bash", command="sleep 60"), FINISH],
    "disk-full": [
        call("bash", command="head -c 5000000 /dev/zero > big.bin"),
        call("python", code="open('big2.bin', 'wb').write(b'0' * 5_000_000)"),
        call("bash", command="stat -c %s big.bin big2.bin; echo still here > out.txt"),
        FINISH,
    ],
    "over-quota": [  # files under the file limit, far past the disk quota, into /tmp
        call("bash", command="for i in $(seq 4096); do head -c 1000000 /dev/zero > /tmp/f$i; done", timeout=60),
        FINISH,
    ],
    "kernel-exits": [
        call("python", code="x = 41"),
        call("python", code="import os; os._exit(1)"),
        call("python", code="print(x + 1)"),
        call("python", code="print('kernel back')"),
        FINISH,
    ],
    "kernel-killed": [
        call("python", code="import time; open('started', 'w').close(); time.sleep(60)"),
        call("python", code="print('back')"),
        FINISH,
    ],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path, tokenizer: Any) -> Iterator[Stack]:
    with scripted_agent_stack(tmp_path_factory.mktemp("sandbox-faults"), model_dir, ENV, SCRIPTS, tokenizer) as up:
        yield up


@pytest.fixture()
def api(stack: Stack) -> httpx.Client:
    return client_for(stack)


def test_the_tool_server_killed_mid_call_fails_the_job(stack: Stack, api: httpx.Client, figure) -> None:
    """SIGKILL of the tool server (the OOM killer's choice, say) while a bash call runs: the job is
    `failed` with SandboxError, not scored. The shell and kernel state the agent built is gone and the
    fault is the infrastructure's, so a reward (0 or otherwise) would train the policy on noise; a
    failed job is one the trainer drops or resubmits. The partial trajectory is kept."""
    pid = rollout_worker(stack)
    job_id = submit(api, "server-dies", kind="agent-echo")
    server = find_process(pid, "python", "workers.toolserver")
    find_process(server, "sleep", "60")  # the call is running
    killed = time.monotonic()
    kill(server)
    record = wait_status(api, job_id, timeout=60)
    ended = time.monotonic() - killed
    assert record["status"] == "failed", record
    error = record["error"]
    assert error["stage"] == "rollout" and error["type"] == "SandboxError", error
    assert "tool server failed" in error["message"]
    partial = record["partial"]["trajectory"]
    assert partial["stop_reason"] == "error" and partial["counts"]["turns"] == 1
    assert_worker_serves_next_job(stack, api, pid)
    figure(f"tool server SIGKILLed mid-call: job failed (SandboxError) {ended:.1f} s after the kill")


def test_filling_the_workspace_is_an_error_observation(stack: Stack, api: httpx.Client, figure) -> None:
    """Writes past RLIMIT_FSIZE (ROLLOUTS_SANDBOX_FILE_SIZE_BYTES, 1 MiB here) fail with EFBIG:
    the agent's own action against its own quota, like any failing command, so it is an error
    observation and the job goes on to be scored. The files stop at the limit. (The tool server is
    Python, which ignores SIGXFSZ, and its children inherit that: a write gets EFBIG rather than a
    kill; bash reports it as a failing command, exit code 1, as it reports every failing command.)"""
    pid = rollout_worker(stack)
    job_id = submit(api, "disk-full", kind="agent-tools")
    record = wait_status(api, job_id, timeout=90)
    assert record["status"] == "done", record.get("error")
    trajectory = record["result"]["trajectory"]
    shell, kernel, check = observations(trajectory)[:3]
    assert shell["exit_code"] != 0 and "File too large" in shell["output"], shell  # bash: EFBIG, not SIGXFSZ
    assert kernel["is_error"] and "File too large" in kernel["output"], kernel
    assert check["output"].split() == [str(FILE_SIZE_BYTES), str(FILE_SIZE_BYTES)], check
    assert trajectory["extra"] == {"out": "still here"} and record["result"]["reward"] == 1.0
    assert_worker_serves_next_job(stack, api, pid)
    figure(
        f"writes past the {FILE_SIZE_BYTES >> 20} MiB file limit (bash, python): error observations, "
        f"files capped at {FILE_SIZE_BYTES} bytes, job done"
    )


def test_writing_past_the_disk_quota_fails_the_job(stack: Stack, api: httpx.Client, figure) -> None:
    """Many files, each under the file limit, into /tmp (on disk, in the quota with the workspace):
    the worker's quota watch ends the sandbox and the job is `failed` with SandboxDiskQuotaExceeded
    naming the setting, never scored; the worker lives on."""
    pid = rollout_worker(stack)
    job_id = submit(api, "over-quota", kind="agent-tools")
    record = wait_status(api, job_id, timeout=90)
    assert record["status"] == "failed", record
    error = record["error"]
    assert error["stage"] == "rollout" and error["type"] == "SandboxDiskQuotaExceeded", error
    assert "sandbox_disk_bytes" in error["message"] and record.get("result") is None, record.get("result")
    assert_worker_serves_next_job(stack, api, pid)
    figure(f"4096 x 1 MB into /tmp past a {DISK_BYTES >> 20} MiB disk quota: job failed ({error['message'][:80]})")


def test_a_kernel_that_exits_is_an_error_observation(stack: Stack, api: httpx.Client, figure) -> None:
    """`os._exit(1)` in the kernel: the tool server restarts the kernel and says so. The kernel is
    part of the agent's environment that its own code can break (like `exit` in bash), and the
    sandbox is intact, so the agent sees the error, learns its state is gone, and the job goes on."""
    pid = rollout_worker(stack)
    job_id = submit(api, "kernel-exits", kind="agent-tools")
    record = wait_status(api, job_id, timeout=90)
    assert record["status"] == "done", record.get("error")
    _, died, lost, back = observations(record["result"]["trajectory"])[:4]
    assert died["is_error"] and "kernel died" in died["output"], died
    assert lost["is_error"] and "NameError" in lost["output"], "the restarted kernel has fresh state"
    assert not back["is_error"] and back["output"].strip() == "kernel back"
    assert_worker_serves_next_job(stack, api, pid)
    figure(f"kernel os._exit(1): error observation, kernel restarted in {died['duration_s']:.1f} s, job done")


def test_a_kernel_killed_mid_call_is_an_error_observation(stack: Stack, api: httpx.Client, figure) -> None:
    """SIGKILL of the kernel from outside mid-call (the OOM killer): the same as a kernel that
    exits; the call ends at once with the error, not at its timeout."""
    pid = rollout_worker(stack)
    job_id = submit(api, "kernel-killed", kind="agent-tools")
    server = find_process(pid, "python", "workers.toolserver")
    started = stack.settings.workspaces / job_id / "started"
    wait_for(started.exists, timeout=60, what="the call to be running in the kernel")
    fork_server = next(child for child in children(server) if "--fork-server" in argv_of(child))
    kernel = find_process(fork_server, "python")  # the kernel: the fork server's one child, a fork of it
    killed = time.monotonic()
    kill(kernel)
    record = wait_status(api, job_id, timeout=90)
    assert record["status"] == "done", record.get("error")
    died, back = observations(record["result"]["trajectory"])[:2]
    assert died["is_error"] and "kernel died" in died["output"] and not died["timed_out"], died
    assert back["output"].strip() == "back"
    assert_worker_serves_next_job(stack, api, pid)
    figure(
        f"kernel SIGKILLed mid-call: error observation after {died['duration_s']:.1f} s of the call "
        f"(kill to job done {time.monotonic() - killed:.1f} s), job done"
    )


class _StartInterrupted:
    """A sandbox whose start is cut short by the stage's deadline, as the supervisor does it."""

    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx

    def start(self) -> None:
        self.ctx.interrupt("timed_out")  # runs the on_interrupt hook: stop() under a waiting start()
        raise SandboxError("local sandbox failed to start: the sandbox exited before its tool server was ready")

    def stop(self) -> None:
        pass


def test_a_deadline_during_sandbox_start_is_an_interruption(tmp_path: Path, monkeypatch) -> None:
    """Regression: the deadline (or a cancel) kills a sandbox that is still starting, and start()
    raises SandboxError; that escaped as a plain error, so the job said `failed` with "sandbox failed
    to start" instead of `timed_out`. Found by the stage-limit case of test_backend_faults under load
    (sandbox start-up took longer than the 1.5 s limit). Unit-level: where the deadline lands in a
    real start-up is a race."""
    from workers.rollout import agent_task, job_sandbox

    settings = Settings(state_dir=tmp_path, sandbox_pool=False)  # the job's own start, where the deadline lands
    ctx = StageContext(
        job_id="j",
        stage="rollout",
        request=JobRequest(task={"kind": "agent-echo"}),
        outputs={},
        workspace=tmp_path / "ws",
        settings=settings,
        deadline=time.time() + 60,
    )
    monkeypatch.setattr(job_sandbox, "create_sandbox", lambda *args: _StartInterrupted(ctx))
    with pytest.raises(StageInterrupted) as stopped:
        agent_task.start_sandbox(ToolsAgentKind(), ctx)
    assert stopped.value.reason == "timed_out"
