"""rq's failure callback: what happens to the job record when rq, not the runner, sees a failure.

The stage runner catches every exception a task raises, so rq reports a
failure only when
- a worker vanished mid-job (an abandoned job found by registry cleanup), or
  Redis was unreachable past the client's retries, or refused writes (its disk full:
  MISCONF) where the runner does not hold the write: rq re-queues the job while
  it has retries left (the runner re-takes a job whose status is its own
  stage), and after the last one the record is marked failed;
- the runner itself raised (a bug): the job fails at once with the traceback,
  rather than being retried into the same bug;
- rq's own bookkeeping failed after the runner returned (the runner already recorded what the
  attempt did): nothing more is done.
Either way a job is never silently lost, and what it held (backend pin, workspace)
goes through the job end (workers/runtime/job_end.py).
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.exceptions import AbandonedJobError
from rq.job import Job

from shared.jobs.queues import is_stage_rq_job_id, parse_rq_job_id
from shared.jobs.record_fields import lost_field
from shared.jobs.status import TERMINAL, JobStatus
from shared.jobs.store import JobStore
from shared.metrics import MetricsRecorder
from shared.redis_conn import write_refusal
from workers.runtime.job_end import Ended, worker_job_ended
from workers.runtime.stage_runner import runner_returned
from workers.runtime.state import state

log = logging.getLogger("rollouts.worker")


RETRYABLE = (AbandonedJobError, RedisConnectionError, RedisTimeoutError)


def on_stage_failure(job: Job, connection: Redis, exc_type: type, exc_value: BaseException, tb: Any) -> None:
    if not is_stage_rq_job_id(job.id):
        log.warning("rq job %r is not one of this service's (forged?); dropped without touching any job", job.id)
        job.retries_left = 0
        return
    job_id, stage = parse_rq_job_id(job.id)
    if runner_returned(job.id):
        log.warning(
            "job %s: rq failed to record the end of the %s attempt (%s: %s); the job's record stands",
            job_id,
            stage,
            exc_type.__name__,
            exc_value,
        )
        job.retries_left = 0
        return
    # The process's own store and settings: its workspaces are where the stage runner put them.
    st = state()
    store, metrics = st.store, st.metrics
    if not issubclass(exc_type, RETRYABLE) and write_refusal(exc_value) is None:
        error = {
            "stage": stage,
            "type": "internal_error",
            "message": f"{exc_type.__name__}: {exc_value}",
            "traceback": "".join(traceback.format_exception(exc_type, exc_value, tb)) if tb else "",
        }
        log.error("job %s: the %s stage runner raised %s; failing the job", job_id, stage, exc_type.__name__)
        job.retries_left = 0  # rq decides on retries after this callback, with this same job object
        _fail(store, metrics, job_id, stage, error)
        return
    if job.retries_left:
        log.warning(
            "job %s: %s worker lost (%s); re-queued, %d retries left",
            job_id,
            stage,
            exc_type.__name__,
            job.retries_left,
        )
        connection.hincrby(store.keys.job(job_id), lost_field(stage), 1)
        metrics.error(stage, "worker_lost")
        return
    error = {
        "stage": stage,
        "type": "worker_lost" if exc_type.__name__ == "AbandonedJobError" else exc_type.__name__,
        "message": f"the {stage} worker stopped without finishing the job ({exc_type.__name__}); no retries left",
    }
    _fail(store, metrics, job_id, stage, error)


def _fail(store: JobStore, metrics: MetricsRecorder, job_id: str, stage: str, error: dict[str, Any]) -> None:
    """Fail the job if it is still in this stage; a job found over (cancelled while its worker was
    gone) is tidied the same way. A rollout whose worker died never released its backend: the
    hook does, now rather than when its lease expires."""
    moved = store.transition(job_id, (stage,), JobStatus.FAILED, {"error": error})
    if moved.applied:
        ended = Ended(JobStatus.FAILED, moved=True, error=error)
    elif moved.previous in TERMINAL or not moved.previous:
        ended = Ended(moved.previous, moved=False)
    else:
        return  # past this stage: the stage that has the job owns its state
    worker_job_ended(store, job_id, ended, metrics)
