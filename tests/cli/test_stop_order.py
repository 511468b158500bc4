"""Ctrl-C of `rollouts up` as a terminal sends it: SIGINT to the whole foreground process group.

The stack must stop in order (workers hand their running jobs back through Redis, then the API,
Redis last), log no connection errors, and leave every job handed back, none running. A second
Ctrl-C kills everything at once and says so. `rollouts up` again on the same state dir ends every job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

import httpx
from redis import Redis
from rq import Queue
from rq.registry import StartedJobRegistry

from cli.embedded_redis import EmbeddedRedis, free_port
from shared.config import STAGES
from tests.cli.test_cli import ROLLOUTS, ROOT, alive, children_of, cli_env
from tests.support.waiting import wait_for

# Two jobs held in each stage, long enough that Ctrl-C finds them all running; the next attempt
# (after a restart) does not sleep.
JOBS = [
    {"task": {"kind": "scripted", "sleep": {stage: 120}, "sleep_first_attempt_only": True}}
    for stage in STAGES
    for _ in range(2)
]


def start_up(
    tmp_path: Path, port: int, log_name: str = "up.log", drain_timeout: float = 1.0
) -> tuple[subprocess.Popen, IO[str]]:
    """`rollouts up` leading a process group of its own, as a shell runs a foreground job."""
    log = open(tmp_path / log_name, "w")  # noqa: SIM115 - returned: the caller closes it
    env = cli_env(tmp_path, ROLLOUTS_TASK_MODULES="tests.support.kinds", ROLLOUTS_HEARTBEAT_INTERVAL_S="1")
    up = subprocess.Popen(
        [*ROLLOUTS, "up", "--port", str(port), "--no-vllm", "--drain-timeout", str(drain_timeout)],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_for(lambda: len(children_of(up.pid)) >= 5, timeout=60, what="redis, the API and three workers")
    return up, log


def argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def roles(up_pid: int) -> tuple[int, list[int]]:
    """(redis-server's pid, the workers' pids) among `up`'s children."""
    children = children_of(up_pid)
    (redis,) = [pid for pid in children if Path(f"/proc/{pid}/comm").read_text().strip() == "redis-server"]
    workers = [pid for pid in children if any(arg.startswith("workers.") for arg in argv(pid))]
    assert len(workers) == len(STAGES), [argv(pid) for pid in children]
    return redis, workers


def submit_and_wait_running(port: int) -> list[str]:
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    wait_for(lambda: api.get("/healthz").status_code == 200, what="the API")
    ids = api.post("/v1/jobs", json=JOBS).json()["job_ids"]

    def all_running() -> bool:
        jobs = [api.get(f"/v1/jobs/{job_id}").json() for job_id in ids]
        stages = [job["request"]["task"]["sleep"] for job in jobs]
        return all(
            job["status"] == stage and job["timings"].get(stage, {}).get("started")
            for job, sleep in zip(jobs, stages)
            for stage in sleep
        )

    wait_for(all_running, timeout=120, interval=0.5, what="a job running in every stage")
    return ids


def stop_times(pids: list[int], up: subprocess.Popen) -> dict[int, float]:
    """When each pid was first seen gone, watching until `up` exits."""
    gone: dict[int, float] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = time.monotonic()
        for pid in pids:
            if pid not in gone and not alive(pid):
                gone[pid] = now
        if up.poll() is not None and len(gone) == len(pids):
            return gone
        time.sleep(0.01)
    raise AssertionError(f"`up` did not stop; gone so far: {gone}")


def test_ctrl_c_to_the_group_stops_workers_before_redis_hands_every_job_back_and_they_end_done_after_up(tmp_path):
    port = free_port()
    up, log = start_up(tmp_path, port)
    try:
        redis_pid, worker_pids = roles(up.pid)
        ids = submit_and_wait_running(port)
        os.killpg(up.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        gone = stop_times([redis_pid, *worker_pids], up)
        output = (tmp_path / "up.log").read_text()
        assert up.wait() == 0, output[-3000:]
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        log.close()
    assert max(gone[pid] for pid in worker_pids) <= gone[redis_pid], "Redis stopped before a worker"
    for sign in ("Connection refused", "ConnectionError", "Error 111", "second interrupt"):
        assert sign not in output, output[-3000:]

    # Every job is handed back to its stage's queue, none left running: read the persistent Redis.
    with EmbeddedRedis(data_dir=tmp_path / "state" / "redis", appendonly=True) as server:
        redis = Redis.from_url(server.url)
        for stage in STAGES:
            assert StartedJobRegistry(stage, connection=redis).get_job_ids() == [], f"{stage} jobs left running"
        queued = {rq_id.split("-")[0] for stage in STAGES for rq_id in Queue(stage, connection=redis).job_ids}
        for job_id in ids:
            status = redis.hget(f"ro:job:{job_id}", "status")
            assert status is not None and status.decode() in STAGES, (job_id, status)
            stage = status.decode()
            assert redis.hget(f"ro:job:{job_id}", f"t:{stage}:requeued") is not None, f"{job_id} was not handed back"
            assert job_id in queued, f"{job_id} is in no queue"
        redis.close()

    # `rollouts up` again on the same state dir: every job handed back ends done.
    up, log = start_up(tmp_path, port, "up-again.log")
    try:
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        wait_for(lambda: api.get("/healthz").status_code == 200, what="the API again")

        def all_ended() -> list[str] | None:
            statuses = [api.get(f"/v1/jobs/{job_id}").json()["status"] for job_id in ids]
            return statuses if all(s in ("done", "failed", "timed_out", "cancelled") for s in statuses) else None

        assert wait_for(all_ended, timeout=120, interval=0.5, what="every job to end") == ["done"] * len(ids)
        os.killpg(up.pid, signal.SIGINT)
        assert up.wait(timeout=60) == 0
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        log.close()


def test_a_second_ctrl_c_kills_everything_at_once_and_says_so(tmp_path):
    port = free_port()
    # A drain far longer than the jobs' 120 s hold would be cut only by the stack's own stop limit
    # (tens of seconds): the first stop is certainly still draining when the second Ctrl-C lands.
    up, log = start_up(tmp_path, port, drain_timeout=600)
    try:
        children = children_of(up.pid)
        submit_and_wait_running(port)
        os.killpg(up.pid, signal.SIGINT)
        wait_for(lambda: "stopping:" in (tmp_path / "up.log").read_text(), what="the first Ctrl-C to be taken")
        os.killpg(up.pid, signal.SIGINT)
        code = up.wait(timeout=60)
        output = (tmp_path / "up.log").read_text()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        log.close()
    assert code == 128 + signal.SIGINT, output[-3000:]
    assert "second interrupt: killing the service processes now" in output
    wait_for(lambda: not [pid for pid in children if alive(pid)], timeout=30, what="every child to be gone")
