"""The rq side of a job: one queue per stage, one rq job per (job, stage).

The rq job id is derived from the job id and the stage, so enqueueing the same
stage twice overwrites instead of duplicating, and any process can find the rq
job of a job without a lookup.
"""

from __future__ import annotations

import re

from redis import Redis
from redis.client import Pipeline
from rq import Callback, Queue, Retry, Worker

from shared.config import STAGES, Settings
from shared.jobs.rq_payloads import FAILURE_CALLBACK, JOB_SERIALIZER, STAGE_FUNCTIONS, StageJob
from shared.jobs.spec import Limits

# Extra seconds past a stage's own limit before rq's hard backstop interrupts it;
# the stage runner stops the job cooperatively well before that.
RQ_TIMEOUT_GRACE_S = 30


_JOB_ID = re.compile(r"[0-9a-f]{32}")  # shared/jobs/store.py's new_job_id
_RQ_JOB_ID = re.compile(rf"[0-9a-f]{{32}}-(?:{'|'.join(STAGES)})(?:-h[0-9]+)?")


def queue_name(stage: str) -> str:
    return stage


def rq_job_id(job_id: str, stage: str, handback: int | None = None) -> str:
    """`<job>-<stage>`, or `<job>-<stage>-h<attempt>` for a job handed back by a stopping worker
    (the stopping worker's own rq job still holds the plain id until rq finishes with it)."""
    return f"{job_id}-{stage}" if handback is None else f"{job_id}-{stage}-h{handback}"


def parse_rq_job_id(rq_id: str) -> tuple[str, str]:
    """(job id, stage) of an rq job id; job ids are hex, so they never contain a dash."""
    job_id, stage = rq_id.split("-")[:2]
    return job_id, stage


def is_job_id(job_id: object) -> bool:
    """Whether `job_id` has the form of this service's job ids (so it is safe in a path)."""
    return isinstance(job_id, str) and _JOB_ID.fullmatch(job_id) is not None


def is_stage_rq_job_id(rq_id: str) -> bool:
    """Whether an rq job id is one this service made (`<32 hex>-<stage>[-h<n>]`); a forged job's id
    must not reach code that turns a job id into a path (its workspace)."""
    return _RQ_JOB_ID.fullmatch(rq_id) is not None


def stage_queue(stage: str, connection: Redis) -> Queue:
    """A stage's rq queue, with JSON payloads and the job class that runs only stage entry points;
    every process that touches rq's queues or registries goes through this."""
    return Queue(queue_name(stage), connection=connection, serializer=JOB_SERIALIZER, job_class=StageJob)


class _WorkerView(Worker):
    """An rq Worker read for status, leaving the caller's client alone: rq's Worker raises the
    client's socket timeout to its dequeue wait (415 s by default) for every later connection,
    which would make the API's fail-fast client wait minutes on a frozen Redis."""

    def _set_connection(self, connection: Redis) -> Redis:
        return connection


def stage_workers(stage: str, connection: Redis) -> list[Worker]:
    """The rq workers (slots) registered on a stage's queue."""
    return _WorkerView.all(queue=stage_queue(stage, connection))


def stage_timeout(limits: Limits, stage: str, settings: Settings) -> float:
    """The job's own limit for the stage, else the deployment's."""
    own = {"init": limits.init_timeout_s, "rollout": limits.rollout_timeout_s, "eval": limits.eval_timeout_s}[stage]
    return float(own or settings.default_stage_timeout(stage))


def total_timeout(limits: Limits, settings: Settings) -> float:
    return float(limits.total_timeout_s or settings.default_total_timeout_s)


def enqueue_stage(
    pipe: Pipeline,
    stage: str,
    job_ids_and_limits: list[tuple[str, Limits]],
    settings: Settings,
    connection: Redis,
    handback: int | None = None,
) -> None:
    """Queue the given jobs on one stage inside the caller's pipeline (one round trip for many);
    a job's limits set rq's backstop timeout."""
    queue = stage_queue(stage, connection)
    datas = [
        Queue.prepare_data(
            STAGE_FUNCTIONS[stage],
            args=(job_id,),
            job_id=rq_job_id(job_id, stage, handback),
            timeout=int(stage_timeout(limits, stage, settings)) + RQ_TIMEOUT_GRACE_S,
            result_ttl=0,  # results live in the job record, not in rq
            failure_ttl=settings.job_ttl_s,
            retry=Retry(max=settings.stage_retries) if settings.stage_retries else None,
            on_failure=Callback(FAILURE_CALLBACK),
            description=f"{stage} {job_id}",
        )
        for job_id, limits in job_ids_and_limits
    ]
    queue.enqueue_many(datas, pipeline=pipe)
