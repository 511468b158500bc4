"""The stage scripts as Slurm array jobs against a test Redis and API: a batch runs through them,
and an array task cancelled or drained mid-job loses nothing and runs nothing twice."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.stack import Stack
from shared.config import STAGES, Settings
from tests.slurm.cluster import GRACE_TIME_S, NODE_CPUS
from tests.slurm.conftest import FAST_SETTINGS, REPO, job_env
from tests.support.holds import Gate
from tests.support.waiting import trace, wait_for, wait_status

TASKS = {"init": 1, "rollout": 2, "eval": 1}
DRAIN_S = 4  # shorter than the cluster's KillWait (10 s): a plain scancel still ends in a hand-back


@pytest.fixture()
def fleet(slurm, write_config, tmp_path: Path) -> Iterator[dict]:
    """Redis and the API run here; each stage is an array job of the real slurm/<stage>.sbatch."""
    settings = Settings(redis_url=None, state_dir=tmp_path / "state")
    stack = Stack(settings, api_port=0, workers_per_stage=0, log_dir=tmp_path / "logs", extra_env=FAST_SETTINGS)
    stack.start()
    config = write_config(
        ROLLOUTS_REDIS_URL=stack.redis_url,
        ROLLOUTS_API_URL=stack.api_url,
        ROLLOUTS_DRAIN_TIMEOUT_S=str(DRAIN_S),
        **{f"ROLLOUTS_{stage.upper()}_CONCURRENCY": "2" for stage in STAGES},
    )
    arrays = {}
    try:
        for stage, n in TASKS.items():
            arrays[stage] = slurm.sbatch(
                REPO / "slurm" / f"{stage}.sbatch",
                f"--array=0-{n - 1}",
                "--time=10",
                f"--partition={slurm.partition}",
                f"--output={tmp_path}/logs/%x-%A_%a.log",
                env=job_env(config),
                cwd=REPO,
            )
        api = httpx.Client(base_url=stack.api_url, timeout=10.0)
        wait_for(lambda: _processes(api) == TASKS, timeout=90, what=f"{TASKS} worker processes to register")
        yield {"api": api, "arrays": arrays, "slurm": slurm, "env": job_env(config)}
    finally:
        for array in arrays.values():
            slurm.run(["scancel", array], check=False)
        wait_for(lambda: not any(slurm.tasks(a) for a in arrays.values()), timeout=30, what="the arrays to end")
        stack.stop(timeout=10)


def _processes(api: httpx.Client) -> dict[str, int]:
    stages = api.get("/v1/status").json()["stages"]
    return {stage: stages[stage]["processes"] for stage in STAGES}


def _submit(api: httpx.Client, trace_dir: Path, tasks: list[dict]) -> list[str]:
    jobs = [{"task": {"kind": "scripted", "trace": str(trace_dir), **task}} for task in tasks]
    response = api.post("/v1/jobs", json=jobs)
    response.raise_for_status()
    return response.json()["job_ids"]


def _started(trace_dir: Path, job_id: str, stage: str, attempt: int = 1) -> int:
    """The pid of the worker that started `stage` of the job (from the scripted kind's trace)."""
    prefix = f"{stage} start attempt={attempt}"
    line = wait_for(
        lambda: next((line for line in trace(trace_dir, job_id) if line.startswith(prefix)), None),
        timeout=60,
        what=f"{job_id} to start {stage}",
    )
    return int(line.rsplit("pid=", 1)[1])


def _array_task(pid: int) -> str:
    """The Slurm array task a worker runs as: the batch shell exec'ed the worker, so its
    environment is the job's."""
    env = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"


def _assert_all_done_once(api: httpx.Client, trace_dir: Path, ids: list[str]) -> None:
    for job_id in ids:
        record = wait_status(api, job_id, timeout=90)
        assert record["status"] == "done", record
        ends = [line for line in trace(trace_dir, job_id) if line.startswith("eval end")]
        assert len(ends) == 1, f"{job_id} completed {len(ends)} times"


def test_a_batch_runs_through_the_stage_arrays_and_a_cancelled_task_loses_nothing(fleet, trace_dir):
    api, slurm = fleet["api"], fleet["slurm"]
    victim = {"sleep": {"rollout": 120}, "sleep_first_attempt_only": True}
    ids = _submit(api, trace_dir, [victim] + [{"sleep": {"init": 0.2, "rollout": 1, "eval": 0.2}}] * 11)
    pid = _started(trace_dir, ids[0], "rollout")
    task = _array_task(pid)

    slurm.run(["scancel", task])  # SIGTERM to the whole task, SIGKILL after KillWait

    _assert_all_done_once(api, trace_dir, ids)
    record = wait_status(api, ids[0])
    assert record["attempts"]["rollout"] == 2
    assert "requeued" in record["timings"]["rollout"], "the worker should have handed the job back"
    assert _started(trace_dir, ids[0], "rollout", attempt=2) != pid
    assert wait_for(lambda: slurm.job_state(task) == "CANCELLED", timeout=30, what=f"{task} to end")
    others = {t: s for t, s in slurm.tasks(fleet["arrays"]["rollout"]).items() if t != task}
    assert list(others.values()) == ["RUNNING"], others


def test_a_drained_task_finishes_its_running_job_then_exits_cleanly(fleet, trace_dir):
    api, slurm = fleet["api"], fleet["slurm"]
    ids = _submit(api, trace_dir, [{"sleep": {"rollout": DRAIN_S - 2}}])
    pid = _started(trace_dir, ids[0], "rollout")
    task = _array_task(pid)

    # What slurm/stack.sh down does: SIGTERM to the batch shell (the worker) only.
    slurm.run(["scancel", "--batch", "--signal=TERM", task])

    wait_for(lambda: slurm.job_state(task) != "RUNNING", timeout=30, what=f"{task} to exit")
    assert slurm.job_state(task) == "COMPLETED"
    _assert_all_done_once(api, trace_dir, ids)
    record = wait_status(api, ids[0])
    assert record["attempts"]["rollout"] == 1, "the job should have finished in the draining worker"
    assert not os.path.exists(f"/proc/{pid}")


def test_a_task_near_its_time_limit_is_warned_and_hands_its_job_back(fleet, trace_dir, tmp_path):
    api, slurm, arrays = fleet["api"], fleet["slurm"], fleet["arrays"]
    slurm.run(["scancel", "--batch", "--signal=TERM", arrays["rollout"]])  # idle: they exit at once
    wait_for(lambda: not slurm.tasks(arrays["rollout"]), timeout=30, what="the rollout array to drain")
    gate = Gate(tmp_path / "release")  # the job runs until it is handed back, however late the warning comes
    ids = _submit(api, trace_dir, [gate.hold("rollout")])

    # Time limit warnings: SIGTERM to the batch shell (the worker) 240 s before the end. sbatch(1): "the
    # signal may be sent up to 60 seconds earlier than specified" (slurmctld checks limits periodically).
    # The task starts with ten minutes; once its worker has taken the job, the limit is cut to 180-240 s
    # from now: the warning is due at once and comes at slurmctld's next check, the worker keeps the
    # same two minutes or more to hand the job back before the kill, and no test waits out a limit.
    def rollout_task(*options: str) -> str:
        return slurm.sbatch(
            REPO / "slurm" / "rollout.sbatch",
            f"--partition={slurm.partition}",
            *options,
            f"--output={tmp_path}/logs/%x-%A_%a.log",
            env=fleet["env"],
            cwd=REPO,
        )

    short = rollout_task("--time=10", "--signal=B:TERM@240")
    try:
        pid = _started(trace_dir, ids[0], "rollout")
        _cut_time_limit(slurm, f"{short}_0", left_s=180)
        wait_for(lambda: not slurm.tasks(short), timeout=300, what="the short task to end")
        assert slurm.job_state(f"{short}_0") == "COMPLETED", "the worker should have exited before its time limit"
        record = api.get(f"/v1/jobs/{ids[0]}").json()
        assert "requeued" in record["timings"]["rollout"], record
    finally:
        gate.release()

    rollout_task("--time=10")
    record = wait_status(api, ids[0], timeout=90)
    assert record["status"] == "done" and record["attempts"]["rollout"] == 2
    assert _started(trace_dir, ids[0], "rollout", attempt=2) != pid


def _run_seconds(slurm, task: str) -> int:
    """How long the task has run, as Slurm counts it (squeue's %M: [[days-]hours:]minutes:seconds)."""
    elapsed = slurm.run(["squeue", "-h", "-j", task, "-o", "%M"]).stdout.strip()
    days, _, clock = elapsed.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


def _cut_time_limit(slurm, task: str, left_s: int) -> None:
    """Set the running task's limit (whole minutes, as Slurm keeps it) to end left_s to left_s + 60 s from now."""
    minutes = (_run_seconds(slurm, task) + left_s) // 60 + 1
    slurm.run(["scontrol", "update", f"JobId={task}", f"TimeLimit={minutes}"])


def test_a_preempted_task_is_warned_and_hands_its_job_back(fleet, trace_dir, tmp_path):
    api, slurm = fleet["api"], fleet["slurm"]
    ids = _submit(api, trace_dir, [{"sleep": {"rollout": 120}, "sleep_first_attempt_only": True}])
    pid = _started(trace_dir, ids[0], "rollout")
    task = _array_task(pid)

    # A job of a higher-tier partition wanting the whole node preempts every task of the fleet.
    slurm.sbatch(
        None,
        "--partition=urgent",
        f"--cpus-per-task={NODE_CPUS}",
        "--wrap=sleep 1",
        f"--output={tmp_path}/logs/urgent-%j.log",
    )
    wait_for(lambda: not slurm.tasks(task), timeout=GRACE_TIME_S + 20, what=f"{task} to be preempted")
    # Gone on its own (exit 0): it acted on the warning signal, and was never killed at the end of
    # the grace time (that would read PREEMPTED), whatever the machine's speed.
    assert slurm.job_state(task) == "COMPLETED"
    assert "requeued" in api.get(f"/v1/jobs/{ids[0]}").json()["timings"]["rollout"]

    for stage in ("rollout", "eval"):  # a fresh fleet once the urgent job is done
        slurm.sbatch(
            REPO / "slurm" / f"{stage}.sbatch",
            f"--partition={slurm.partition}",
            "--time=10",
            f"--output={tmp_path}/logs/%x-%A_%a.log",
            env=fleet["env"],
            cwd=REPO,
        )
    record = wait_status(api, ids[0], timeout=90)
    assert record["status"] == "done" and record["attempts"]["rollout"] == 2
    assert _started(trace_dir, ids[0], "rollout", attempt=2) != pid
