"""However a job ends, it leaves no workspace and no backend pin; a superseded attempt leaves both alone.

In-process: the stages run through their rq entry points against the session's redis-server, the
way a slot runs them, and the supervisor's cancel check is called directly. The kind holds its pin
past the end of its rollout on purpose (like a rollout cut off mid-generation, or whose worker
died): the job end, not the kind, must release it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rq.exceptions import AbandonedJobError

from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.jobs.status import JobStatus
from shared.tasks import StageContext, TaskKind, register
from tests.support.waiting import wait_for
from workers.eval import stage as eval_stage
from workers.init import stage as init_stage
from workers.rollout import stage as rollout_stage
from workers.runtime import stage_runner
from workers.runtime import state as worker_state
from workers.runtime.failure import on_stage_failure
from workers.runtime.state import WorkerState, init_state


@register
class PinHolder(TaskKind):
    """Init makes a workspace; rollout pins a backend and ends as `task.end` says, never releasing it."""

    name = "pin-holder"

    def init(self, ctx: StageContext) -> dict[str, Any]:
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        (ctx.workspace / "state.txt").write_text("init\n")
        return {}

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        _pool(worker_state.state()).acquire(ctx.job_id, ctx.request.group_id)
        end = ctx.task.get("end", "done")
        if end == "fail":
            raise RuntimeError("the rollout failed")
        if end == "hang":
            ctx.sleep(60)  # until cancelled, superseded or over its time limit
        return {"turns": 0}

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        return {"reward": 1.0}


def _pool(st: WorkerState) -> BackendPool:
    return BackendPool(st.redis, st.store.keys, st.settings)


@pytest.fixture()
def worker(settings: Settings) -> Iterator[WorkerState]:
    """This process as a worker on the test's Redis, with one registered backend to pin."""
    saved = worker_state._state
    worker_state._state = None
    st = init_state(settings, "rollout")
    _pool(st).register("http://127.0.0.1:9", "tiny")
    yield st
    st.redis.close()
    worker_state._state = saved


def submit(st: WorkerState, **job: Any) -> str:
    spec = {"task": {"kind": "pin-holder", **job.pop("task", {})}, **job}
    (submitted,) = st.store.submit([spec])
    return submitted.job_id


def pinned(st: WorkerState, job_id: str) -> bool:
    return bool(st.redis.hexists(st.store.keys.llm_charges, job_id))


def run_in_thread(job_id: str) -> tuple[threading.Thread, list[str]]:
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(rollout_stage.run(job_id)), daemon=True)
    thread.start()
    return thread, result


def enforce_cancels(st: WorkerState) -> None:
    """What the supervisor does every heartbeat (and the events channel does at once)."""
    running = st.inflight.snapshot()
    observed = st.store.running_state([(ctx.job_id, ctx.stage) for ctx in running])
    st.inflight.enforce({ctx.job_id: seen for ctx, seen in zip(running, observed)})


def assert_left_nothing(st: WorkerState, job_id: str) -> None:
    assert not (st.settings.workspaces / job_id).exists(), "the workspace outlived its job"
    assert not pinned(st, job_id), "the backend pin outlived its job"
    assert _pool(st).inflight_total() == 0


def test_done(worker: WorkerState) -> None:
    job_id = submit(worker)
    assert init_stage.run(job_id) == "queued:rollout"
    assert rollout_stage.run(job_id) == "queued:eval"
    assert pinned(worker, job_id) and (worker.settings.workspaces / job_id).exists()
    assert eval_stage.run(job_id) == JobStatus.DONE
    assert worker.store.status(job_id) == JobStatus.DONE
    assert_left_nothing(worker, job_id)


def test_failed(worker: WorkerState) -> None:
    job_id = submit(worker, task={"end": "fail"})
    init_stage.run(job_id)
    assert rollout_stage.run(job_id) == JobStatus.FAILED
    assert worker.store.get(job_id)["error"]["message"] == "the rollout failed"
    assert_left_nothing(worker, job_id)


def test_timed_out(worker: WorkerState) -> None:
    job_id = submit(worker, task={"end": "hang"}, limits={"rollout_timeout_s": 0.5})
    init_stage.run(job_id)
    assert rollout_stage.run(job_id) == JobStatus.TIMED_OUT
    assert worker.store.status(job_id) == JobStatus.TIMED_OUT
    assert_left_nothing(worker, job_id)


def test_cancelled_while_running(worker: WorkerState) -> None:
    job_id = submit(worker, task={"end": "hang"})
    init_stage.run(job_id)
    thread, result = run_in_thread(job_id)
    wait_for(lambda: pinned(worker, job_id), what="the rollout to pin a backend")

    assert worker.store.cancel(job_id).applied
    enforce_cancels(worker)
    thread.join(timeout=30)

    assert result == [JobStatus.CANCELLED]
    assert_left_nothing(worker, job_id)


def test_cancelled_while_queued_for_the_next_stage(worker: WorkerState) -> None:
    job_id = submit(worker)
    init_stage.run(job_id)
    assert worker.store.cancel(job_id).applied
    assert rollout_stage.run(job_id) == "skipped:cancelled"
    assert_left_nothing(worker, job_id)


def test_worker_lost_for_good(worker: WorkerState) -> None:
    """rq's failure callback, after the last retry of a rollout whose worker died holding its pin."""
    job_id = submit(worker)
    init_stage.run(job_id)
    assert worker.store.take(job_id, "rollout", ("rollout",), "a-worker-that-dies").applied
    _pool(worker).acquire(job_id)

    rq_job = SimpleNamespace(id=f"{job_id}-rollout", retries_left=0)
    on_stage_failure(rq_job, worker.redis, AbandonedJobError, AbandonedJobError(), None)

    assert worker.store.get(job_id)["error"]["type"] == "worker_lost"
    assert_left_nothing(worker, job_id)


def test_a_superseded_attempt_leaves_the_workspace_and_pin_to_the_newer_one(worker: WorkerState) -> None:
    job_id = submit(worker, task={"end": "hang"})
    init_stage.run(job_id)
    thread, result = run_in_thread(job_id)
    wait_for(lambda: pinned(worker, job_id), what="the first attempt to pin a backend")

    # The first attempt's worker is wrongly given up for dead: a second attempt takes the job.
    assert worker.store.take(job_id, "rollout", ("rollout",), "another-worker").attempt == 2
    enforce_cancels(worker)
    thread.join(timeout=30)

    assert result == ["superseded"]
    assert (worker.settings.workspaces / job_id / "state.txt").exists()
    assert pinned(worker, job_id)
    assert worker.store.status(job_id) == JobStatus.ROLLOUT


def test_a_rollout_queued_by_a_superseded_init_waits_for_the_newer_one(worker: WorkerState) -> None:
    """An init attempt given up for dead finishes anyway: its move on is refused (a newer attempt
    owns the job) but its rollout is queued in the same transaction. That rollout must not run on a
    record that has no init output yet; the newer attempt's hand-over queues the one that runs."""
    job_id = submit(worker)
    assert worker.store.take(job_id, "init", ("queued",), "given-up-for-dead").attempt == 1
    assert worker.store.take(job_id, "init", ("init",), "the-newer-attempt").attempt == 2

    assert rollout_stage.run(job_id) == "skipped:init"
    record = worker.store.get(job_id)
    assert record["status"] == "init" and "attempts:rollout" not in record, record

    assert init_stage.run(job_id) == "queued:rollout"
    assert rollout_stage.run(job_id) == "queued:eval"


def test_the_api_cancel_releases_the_pin_and_leaves_the_workspace_to_the_worker(
    worker: WorkerState, make_client: Callable[..., TestClient]
) -> None:
    job_id = submit(worker)
    init_stage.run(job_id)
    assert worker.store.take(job_id, "rollout", ("rollout",), "a-worker").applied
    _pool(worker).acquire(job_id)

    assert make_client().delete(f"/v1/jobs/{job_id}").json()["previous"] == "rollout"

    assert not pinned(worker, job_id)
    assert (worker.settings.workspaces / job_id).exists(), "only a worker removes a workspace"


def test_an_rq_error_after_the_runner_returned_leaves_the_record(worker: WorkerState, monkeypatch) -> None:
    """Across a Redis outage one rq job can run twice at once. The older execution is superseded and
    returns; rq's bookkeeping of it then fails (a KeyError on the execution record the newer one
    removed). That must not fail the job the newer attempt is running."""
    job_id = submit(worker, task={"end": "hang"})
    init_stage.run(job_id)
    rq_job = SimpleNamespace(id=f"{job_id}-rollout", retries_left=2, worker_name=None)
    monkeypatch.setattr(stage_runner, "get_current_job", lambda: rq_job)
    result: list[str] = []

    def older_execution() -> None:  # a slot thread: the runner, then rq's failure path on that thread
        result.append(rollout_stage.run(job_id))
        on_stage_failure(rq_job, worker.redis, KeyError, KeyError(b"created_at"), None)

    thread = threading.Thread(target=older_execution, daemon=True)
    thread.start()
    wait_for(lambda: pinned(worker, job_id), what="the first attempt to run")
    assert worker.store.take(job_id, "rollout", ("rollout",), "the-newer-execution").attempt == 2
    enforce_cancels(worker)
    thread.join(timeout=30)

    assert result == ["superseded"]
    record = worker.store.get(job_id)
    assert record["status"] == "rollout" and "error" not in record, record.get("error")
    assert rq_job.retries_left == 0
