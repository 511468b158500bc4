"""Jobs whose large outputs live in the results store: small Redis records, the same API payloads,
and every way the store can fail, each ending in a clear error rather than a lost result or a reward.

In-process, as tests/pipeline/test_job_endings.py: the stages run through their rq entry points
against the session's redis-server, the API through a TestClient on the same Redis and directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from shared.config import Settings
from shared.jobs.status import JobStatus
from shared.results.sweep import sweep_results
from shared.tasks import StageContext, TaskKind, register
from workers.eval import stage as eval_stage
from workers.init import stage as init_stage
from workers.rollout import stage as rollout_stage
from workers.runtime import state as worker_state
from workers.runtime.state import WorkerState, init_state

TOKENS = 8192


@register
class LongTrajectory(TaskKind):
    """A rollout of TOKENS tokens, as the agent loop records them; eval checks it got them all."""

    name = "long-trajectory"

    def init(self, ctx: StageContext) -> dict[str, Any]:
        return {"prepared": True}

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        if ctx.task.get("noise"):  # incompressible bytes: a result that cannot fit a small disk
            return {"token_ids": [1], "noise": os.urandom(int(ctx.task["noise"]))}
        if ctx.task.get("hang"):
            ctx.partial["trajectory"] = {"token_ids": list(range(100))}
            ctx.sleep(60)
        return {
            "token_ids": [i % 50000 for i in range(TOKENS)],
            "logprobs": [-(i % 97) / 10 for i in range(TOKENS)],
            "loss_mask": [i % 3 != 0 for i in range(TOKENS)],
        }

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        if ctx.task.get("hang_in_eval"):
            ctx.sleep(60)
        tokens = len(ctx.outputs["rollout"]["token_ids"])
        return {"reward": 1.0 if tokens == TOKENS else 0.0, "tests": "ok\n" * 500, "tokens": tokens}


@pytest.fixture()
def worker(settings: Settings) -> Iterator[WorkerState]:
    saved = worker_state._state
    worker_state._state = None
    st = init_state(settings, "rollout")
    yield st
    st.redis.close()
    worker_state._state = saved


@pytest.fixture()
def api(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def submit(st: WorkerState, **task: Any) -> str:
    (submitted,) = st.store.submit([{"task": {"kind": "long-trajectory", **task}}])
    return submitted.job_id


def run_to_done(job_id: str) -> None:
    assert init_stage.run(job_id) == "queued:rollout"
    assert rollout_stage.run(job_id) == "queued:eval"
    assert eval_stage.run(job_id) == JobStatus.DONE


def test_a_finished_job_keeps_under_2kb_in_redis_while_get_returns_its_whole_trajectory(
    worker: WorkerState, api: TestClient
) -> None:
    job_id = submit(worker)
    run_to_done(job_id)

    key = worker.store.keys.job(job_id)
    assert worker.redis.memory_usage(key) < 2000
    assert not {b"out:rollout", b"out:eval"} & set(worker.redis.hkeys(key))
    view = api.get(f"/v1/jobs/{job_id}").json()
    assert view["status"] == "done"
    assert view["result"]["reward"] == 1.0
    assert view["result"]["trajectory"]["token_ids"] == [i % 50000 for i in range(TOKENS)]
    assert view["result"]["evaluation"]["tokens"] == TOKENS
    assert api.get("/v1/jobs", params={"ids": job_id}).json()["jobs"][0]["reward"] == 1.0
    status = api.get("/v1/status").json()
    assert status["results"]["files"] == 2 and status["results"]["bytes"] > 0 and status["results"]["healthy"]


def test_a_timed_out_jobs_partial_output_is_stored_and_returned(worker: WorkerState, api: TestClient) -> None:
    (submitted,) = worker.store.submit(
        # The limit runs from the take, before the handler sets its partial: seconds of margin, not 0.5 s.
        [{"task": {"kind": "long-trajectory", "hang": True}, "limits": {"rollout_timeout_s": 3}}]
    )
    init_stage.run(submitted.job_id)
    assert rollout_stage.run(submitted.job_id) == JobStatus.TIMED_OUT
    assert b"partial" not in worker.redis.hkeys(worker.store.keys.job(submitted.job_id))
    view = api.get(f"/v1/jobs/{submitted.job_id}").json()
    assert (view.get("partial") or {}).get("trajectory", {}).get("token_ids") == list(range(100)), view


def test_a_job_that_times_out_in_eval_serves_its_finished_trajectory_as_partial(
    worker: WorkerState, api: TestClient
) -> None:
    (submitted,) = worker.store.submit(
        [{"task": {"kind": "long-trajectory", "hang_in_eval": True}, "limits": {"eval_timeout_s": 0.5}}]
    )
    init_stage.run(submitted.job_id)
    assert rollout_stage.run(submitted.job_id) == "queued:eval"
    assert eval_stage.run(submitted.job_id) == JobStatus.TIMED_OUT
    view = api.get(f"/v1/jobs/{submitted.job_id}").json()
    assert view["result"] is None and view["error"]["stage"] == "eval"
    assert view["partial"]["trajectory"]["token_ids"] == [i % 50000 for i in range(TOKENS)]


def test_a_missing_results_directory_fails_the_job_and_stops_submissions_until_it_is_back(
    worker: WorkerState, api: TestClient
) -> None:
    root = worker.settings.results
    job_id = submit(worker)
    init_stage.run(job_id)
    shutil.move(root, root.with_name("moved-away"))

    assert rollout_stage.run(job_id) == JobStatus.FAILED
    record = worker.store.get(job_id)
    assert record["error"]["type"] == "results_unavailable"
    assert str(root) in record["error"]["message"]
    assert "reward" not in record
    health = api.get("/healthz")
    assert health.status_code == 503 and "does not exist" in health.json()["results"]
    refused = api.post("/v1/jobs", json={"task": {"kind": "long-trajectory"}})
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == str(worker.settings.admission_retry_after_s)
    assert "results store is unhealthy" in refused.json()["detail"]
    assert api.get("/v1/status").json()["results"]["healthy"] is False

    shutil.move(root.with_name("moved-away"), root)
    assert api.get("/healthz").status_code == 200
    assert api.post("/v1/jobs", json={"task": {"kind": "long-trajectory"}}).status_code == 202


@pytest.fixture()
def full_disk(settings: Settings) -> Iterator[None]:
    """A 1 MiB tmpfs over the results directory: a real ENOSPC. Needs root (to mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a size-capped tmpfs needs root")
    settings.results.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(settings.results)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield
    if subprocess.run(["umount", str(settings.results)], capture_output=True, check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(settings.results)], capture_output=True, check=False)


def test_a_full_results_disk_fails_the_job_as_infrastructure_and_the_api_refuses_new_jobs(
    full_disk: None, worker: WorkerState, make_client: Callable[..., TestClient]
) -> None:
    job_id = submit(worker, noise=2 * 1024 * 1024)
    init_stage.run(job_id)

    assert rollout_stage.run(job_id) == JobStatus.FAILED
    error = worker.store.get(job_id)["error"]
    assert error["type"] == "results_unavailable" and "the results store is full" in error["message"]
    assert not [p for p in worker.settings.results.rglob("*") if p.is_file()], "a partial file was left behind"
    api = make_client(results_min_free_bytes=2 * 1024 * 1024)  # more than the whole 1 MiB disk
    assert "bytes free" in api.get("/healthz").json()["results"]
    assert api.post("/v1/jobs", json={"task": {"kind": "long-trajectory"}}).status_code == 503


def test_a_trajectory_lost_between_rollout_and_eval_fails_the_job_naming_the_file(worker: WorkerState) -> None:
    job_id = submit(worker)
    init_stage.run(job_id)
    rollout_stage.run(job_id)
    stored = worker.store.results.path(job_id, "rollout", worker.store.get(job_id)["refs"]["rollout"])
    stored.unlink()

    assert eval_stage.run(job_id) == JobStatus.FAILED
    error = worker.store.get(job_id)["error"]
    assert error["type"] == "results_unavailable" and str(stored) in error["message"]


def test_get_of_a_job_whose_file_was_deleted_is_410_naming_job_and_file(worker: WorkerState, api: TestClient) -> None:
    job_id = submit(worker)
    run_to_done(job_id)
    stored = worker.store.results.path(job_id, "rollout", worker.store.get(job_id)["refs"]["rollout"])
    stored.unlink()

    response = api.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 410
    assert response.json()["job_id"] == job_id and response.json()["file"] == str(stored)
    assert job_id in response.json()["detail"]
    assert api.get("/v1/jobs", params={"ids": job_id}).json()["jobs"][0]["reward"] == 1.0  # the record still lists


def test_get_of_a_job_whose_file_is_corrupt_is_500_naming_job_and_file(worker: WorkerState, api: TestClient) -> None:
    job_id = submit(worker)
    run_to_done(job_id)
    stored = worker.store.results.path(job_id, "eval", worker.store.get(job_id)["refs"]["eval"])
    stored.write_bytes(b"\x28\xb5\x2f\xfd garbage")

    response = api.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 500
    assert response.json()["file"] == str(stored) and "corrupt" in response.json()["detail"]
    assert api.get("/healthz").status_code == 200, "one bad file is not an unhealthy store"


def test_above_the_high_water_mark_submissions_get_503_and_accepted_jobs_go_on(
    worker: WorkerState, make_client: Callable[..., TestClient]
) -> None:
    accepted = submit(worker)
    api = make_client(redis_maxmemory_bytes=1024)  # Redis itself sets none here: the API admits against this

    for path, body in (("/v1/jobs", {"task": {"kind": "long-trajectory"}}), ("/v1/batches", {})):
        refused = api.post(path, json=body)
        assert refused.status_code == 503, path
        assert int(refused.headers["Retry-After"]) > 0
        assert "Redis memory is above its high-water mark" in refused.json()["detail"]
    status = api.get("/v1/status").json()["redis"]
    assert status["limit_bytes"] == 1024 and status["used_bytes"] > 1024 and status["accepting"] is False
    metrics = api.get("/metrics").text
    assert "rollouts_redis_limit_bytes 1024.0" in metrics and "rollouts_results_bytes" in metrics

    run_to_done(accepted)
    assert api.get(f"/v1/jobs/{accepted}").json()["result"]["reward"] == 1.0


def test_the_retention_sweep_removes_old_results_once_per_interval_and_reports_it(
    worker: WorkerState, api: TestClient
) -> None:
    job_id = submit(worker)
    run_to_done(job_id)
    store = worker.store
    before = store.results_usage()
    old = store.results.put("old-job", "rollout", {"token_ids": [1, 2, 3]}, now=time.time() - 8 * 24 * 3600)
    store.redis.hincrby(store.keys.results_usage, "bytes", old[1])
    store.redis.hincrby(store.keys.results_usage, "files", 1)

    report = sweep_results(store.redis, store.keys, store.results, worker.settings)

    assert report is not None and report.files == 1 and report.bytes == old[1]
    assert not store.results.path("old-job", "rollout", old[0]).exists()
    assert store.results_usage() == before
    assert api.get(f"/v1/jobs/{job_id}").json()["result"]["reward"] == 1.0, "a result within retention went"
    assert sweep_results(store.redis, store.keys, store.results, worker.settings) is None, "swept twice in one interval"
    assert f"rollouts_results_swept_bytes_total {float(old[1])}" in api.get("/metrics").text
