"""Jobs that find no LLM backend open to them wait outside the workers, then try again.

A backend can be missing for minutes for ordinary reasons: vLLM takes 1-5 minutes to start (a
Slurm worker array is up long before it), a rolling restart drains every server in turn, a
restarted `rollouts up` hands back jobs before its backend registers. So a stage that finds no
backend hands its job back instead of failing it: the record says since when the job waits
(`t:<stage>:waiting`, and `wait:<stage>` = the attempt that waited), and "<job id>-<stage>" goes
into one sorted set (`Keys.llm_waiting`) scored by when to look again. No worker slot is held and
nothing polls the pool per job: each worker's supervisor re-queues the due entries every heartbeat
(`release_due`), and a backend that registers or reopens makes every entry due at once
(`BackendPool._wake_waiting_jobs`). The job fails only once it has waited `backend_wait_s`.

The hand-back is the same as a draining worker's: the stage is queued again under an rq id of its
own (`<job>-<stage>-h<attempt>`), so it is a fresh rq job with all of rq's retries (`stage_retries`
counts lost workers, not waits), and the next attempt's take counts a new fencing token.

Why a sorted set rather than rq's scheduled jobs (`enqueue_in`): those need rq's scheduler running
beside the slots (they run without it), and waking every waiting job when a backend registers
would mean walking rq's ScheduledJobRegistry from the pool; here the wake is one ZUNIONSTORE.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.exceptions import WatchError

from shared.codec import unpack
from shared.config import Settings
from shared.jobs.queues import enqueue_stage, parse_rq_job_id, rq_job_id
from shared.jobs.record_fields import attempts_field, time_field, wait_field
from shared.jobs.spec import Limits
from shared.jobs.status import AttemptResult
from shared.jobs.store import JobStore

# The first look again comes this soon; later ones after half the time waited so far, up to
# `backend_wait_retry_s` (a wake brings them all forward anyway).
FIRST_RETRY_S = 1.0
WAITING_DETAIL = "waiting for an LLM backend"


@dataclass(frozen=True)
class WaitPlan:
    """What to do with an attempt that found no backend."""

    since: float  # when the job began waiting (the first of consecutive attempts that found none)
    waited_s: float
    expired: bool  # waited `backend_wait_s` already: fail it
    due: float  # else: when to look again


def plan_wait(store: JobStore, job_id: str, stage: str, attempt: int, now: float) -> WaitPlan:
    """How long this job has waited, and when it looks again; the wait spans consecutive attempts
    that each found no backend, and starts afresh after an attempt that ran."""
    fields = (time_field(stage, "waiting"), wait_field(stage))
    since_raw, waited_attempt = store.redis.hmget(store.keys.job(job_id), fields)
    since = now
    if since_raw is not None and waited_attempt is not None and int(waited_attempt) == attempt - 1:
        since = float(since_raw)
    settings = store.settings
    waited = max(0.0, now - since)
    delay = min(settings.backend_wait_retry_s, max(FIRST_RETRY_S, waited / 2))
    due = min(now + delay, since + settings.backend_wait_s)
    return WaitPlan(since=since, waited_s=waited, expired=waited >= settings.backend_wait_s, due=due)


def park(store: JobStore, job_id: str, stage: str, attempt: int, plan: WaitPlan) -> str | None:
    """Record the wait and put the job in the waiting set, in one transaction, only while this
    attempt still owns the job; returns None when parked, else what refused it: the job's status
    (cancelled, or "" when its record is gone) or "superseded" (a newer attempt owns it).

    The job hash is watched, so a cancel or a newer attempt landing between the check and the
    write makes it look again; a wait is never recorded for a job this attempt no longer owns,
    so a stale entry can never start an attempt that supersedes a live one.
    """
    key = store.keys.job(job_id)
    fields = {time_field(stage, "waiting"): plan.since, wait_field(stage): attempt}
    with store.redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)
                status, current = (_text(v) for v in pipe.hmget(key, ("status", attempts_field(stage))))
                if status != stage:
                    return status
                if current != str(attempt):
                    return AttemptResult.SUPERSEDED
                pipe.multi()
                store.queue_transition(pipe, job_id, (stage,), stage, fields, guard=(attempts_field(stage), attempt))
                pipe.zadd(store.keys.llm_waiting, {rq_job_id(job_id, stage): plan.due})
                pipe.execute()
                return None
            except WatchError:
                continue


def _limits(spec: bytes | None) -> Limits:
    """The job's limits (they set rq's backstop timeout); the defaults for a record gone or stored by
    another version's schema, so one odd entry never blocks the set (its worker sorts it out)."""
    try:
        return Limits.model_validate((unpack(spec) or {}).get("limits") or {})
    except (ValueError, TypeError, AttributeError):  # pydantic's ValidationError is a ValueError
        return Limits()


def _text(value: bytes | None) -> str:
    return value.decode() if value is not None else ""


def is_waiting(record: dict) -> bool:
    """Whether the job's latest attempt at its current stage found no backend and waits."""
    stage = record.get("status")
    waited = record.get("wait", {}).get(stage)
    return waited is not None and waited == record.get("attempts", {}).get(stage)


def release_due(store: JobStore, settings: Settings, now: float | None = None, limit: int = 500) -> int:
    """Queue the waiting jobs whose time has come (every one after a wake) on their stage again;
    returns how many entries were taken out.

    Safe from every worker at once: the set is watched, and the removal and the re-queueing are one
    transaction, so each entry is queued by exactly one process and none is lost between the two.
    """
    redis, key = store.redis, store.keys.llm_waiting
    now = time.time() if now is None else now
    with redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)
            due = [member.decode() for member in pipe.zrangebyscore(key, "-inf", now, start=0, num=limit)]
            if not due:
                return 0
            entries = [parse_rq_job_id(member) for member in due]
            with redis.pipeline(transaction=False) as read:
                for job_id, stage in entries:
                    read.hmget(store.keys.job(job_id), ("spec", attempts_field(stage)))
                rows = read.execute()
            pipe.multi()
            pipe.zrem(key, *due)
            for (job_id, stage), (spec, attempt) in zip(entries, rows):
                # Queued whatever the job's status now: a worker that finds it cancelled or gone
                # skips it and removes its workspace, as for any queued job.
                enqueue_stage(pipe, stage, [(job_id, _limits(spec))], settings, redis, handback=int(attempt or 0))
            pipe.execute()
        except WatchError:
            return 0  # another process released (or a wake moved) them meanwhile; the next beat sees the rest
    return len(due)
