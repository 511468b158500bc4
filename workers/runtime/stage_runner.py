"""Run one attempt of one stage of one job: the body of every stage's rq job.

The same for every stage, top to bottom: take the job (which counts the attempt), build its
context, call the stage, then hand the job on, fail it or stop it. What differs per stage (which
kind method it calls, what it records of its output) is the Stage that each workers/<stage>/stage.py
defines and passes in from its rq entry point.

It never lets an exception escape: a task's error becomes a `failed` record with the traceback, an
interruption becomes `cancelled`, `timed_out` or a hand-back to the same queue. rq's own retry is
left for the one case the runner cannot see: its process dying mid-job. A record write that Redis
refuses (its disk full: MISCONF) is held until Redis takes it (held_writes.py). Each path returns an
Outcome; one that ended the job carries `Ended`, and `run_stage` hands that to the job end
(workers/runtime/job_end.py) in one place.
"""

from __future__ import annotations

import errno
import os
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pydantic
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import get_current_job
from rq.timeouts import JobTimeoutException

from shared import log_context
from shared.backend_pool import NoBackendAvailable
from shared.batches.replenish import UNKNOWN, Unknown
from shared.config import STAGES
from shared.errors import JobInputError, ResultsUnavailable, StoredResultError
from shared.jobs.backend_wait import park, plan_wait
from shared.jobs.queues import enqueue_stage, is_job_id, stage_timeout, total_timeout
from shared.jobs.record_fields import attempts_field, output_field, time_field
from shared.jobs.rq_payloads import ForbiddenJobFunction
from shared.jobs.spec import JobRequest
from shared.jobs.status import NEXT_STAGE, STAGE_ENTRY_FROM, TERMINAL, AttemptResult, JobStatus
from shared.jobs.store import STORED_PARTS
from shared.metrics import MetricsRecorder
from shared.redis_conn import write_refusal
from shared.tasks import InterruptReason, StageContext, StageInterrupted, TaskKind, get_kind
from workers.runtime.held_writes import until_written
from workers.runtime.job_end import Ended, worker_job_ended
from workers.runtime.state import WorkerState, log, state


class Stage:
    """What one stage adds to the runner; each stage module defines one and passes it to `run_stage`."""

    name: ClassVar[str]  # the stage's name, its queue's and the status of a job in it

    def call(self, kind: TaskKind, ctx: StageContext) -> dict[str, Any]:
        """Call the kind's method for this stage; the dict it returns is the stage's output."""
        raise NotImplementedError

    def record(self, output: dict[str, Any], metrics: MetricsRecorder) -> None:
        """Metrics from the output of an attempt being handed on; none by default."""

    def summary_fields(self, output: dict[str, Any]) -> dict[str, Any]:
        """Small record fields that sum the output up for the run page (shared/run_stats/); none by default."""
        return {}

    def warm_up(self) -> None:
        """Load what this stage's jobs need once per process (imports, per-process resources). The worker
        runs it on a thread of its own as it starts, so the first jobs of a burst do not all wait behind one
        load; a job that comes first waits for what it needs as before. Nothing by default."""


# (output, interruption, error): what calling the stage gave; at most one of the last two is set.
Performed = tuple[dict[str, Any], str | None, dict[str, Any] | None]
# The error type of a stage that found no LLM backend open to its job: it waits, and fails with
# this type only after `backend_wait_s`.
NO_BACKEND = "no_backend"


@dataclass(frozen=True)
class Outcome:
    """What one attempt did: `result` for logs, metrics and tests; `ended` when the job is over."""

    result: str  # an AttemptResult, or one with what it refers to ("queued:eval")
    ended: Ended | None = None


def run_stage(stage: Stage, job_id: str) -> str:
    """Run one attempt of `stage` for `job_id`; returns what happened (for logs and tests)."""
    if not is_job_id(job_id):
        # A forged rq job (see shared/jobs/rq_payloads.py): its argument must never become a path.
        raise ForbiddenJobFunction(f"{job_id!r} is not a job id; the {stage.name} stage does not run for it")
    st = state()
    current = get_current_job()
    _returned.rq_id = None
    started = time.monotonic()
    with log_context.bind(job_id=job_id, stage=stage.name):
        outcome = _attempt(st, stage, job_id)
        if outcome.ended is not None:
            worker_job_ended(st.store, job_id, outcome.ended, st.metrics)
    st.metrics.stage_attempt(stage.name, outcome.result, time.monotonic() - started)
    _returned.rq_id = current.id if current is not None else None
    return outcome.result


# The rq job whose run_stage last returned on this thread (a slot runs one at a time).
_returned = threading.local()


def runner_returned(rq_job_id: str) -> bool:
    """Whether this thread's runner returned for this rq job: an error rq reports after that is in
    rq's own bookkeeping (two executions of one rq job, each re-queued once across a Redis outage,
    remove each other's execution records), and the job's record already says what the attempt did."""
    return getattr(_returned, "rq_id", None) == rq_job_id


def _attempt(st: WorkerState, stage: Stage, job_id: str) -> Outcome:
    name = stage.name
    # Taking the job moves it into the stage and counts a new attempt, whose number is this
    # attempt's fencing token; a job that is terminal or past this stage is not taken.
    worker = _worker_name(st)
    taken = until_written(
        lambda: st.store.take(job_id, name, STAGE_ENTRY_FROM[name], worker), f"job {job_id}: taking {name}", st.draining
    )
    if not taken.applied:
        return _not_taken(job_id, name, taken.previous)
    record = taken.record
    assert record is not None
    guard = (attempts_field(name), taken.attempt)
    try:
        request = JobRequest.from_stored(record["spec"])
    except pydantic.ValidationError as exc:  # stored by a version of the API whose schema this worker lacks
        error = {"stage": name, "type": "invalid_request", "message": str(exc)}
        return _finish(st, job_id, name, JobStatus.FAILED, error, None, guard, UNKNOWN)
    now = time.time()
    job_deadline = record["created_at"] + total_timeout(request.limits, st.settings)
    if now >= job_deadline:
        error = _timeout_error(name, "total")
        return _finish(st, job_id, name, JobStatus.TIMED_OUT, error, None, guard, request.group_id)
    stage_deadline = now + stage_timeout(request.limits, name, st.settings)
    limit = "total" if job_deadline < stage_deadline else "stage"
    try:
        record = st.store.with_outputs(record)  # an earlier stage's output may sit in the results store
    except StoredResultError as exc:
        error = {"stage": name, "type": "results_unavailable", "message": str(exc)}
        return _finish(st, job_id, name, JobStatus.FAILED, error, None, guard, request.group_id)
    ctx = StageContext(
        job_id=job_id,
        stage=name,
        request=request,
        outputs={s: record[output_field(s)] for s in STAGES if output_field(s) in record},
        workspace=st.workspace(job_id),
        settings=st.settings,
        deadline=min(stage_deadline, job_deadline),
        attempt=taken.attempt,
    )

    st.inflight.add(ctx)
    try:
        output, interrupted, error = _perform(stage, ctx, st.settings.workspaces)
    finally:
        # Sandboxes and other per-stage resources go first, before the record says anything.
        st.inflight.remove(ctx)
        ctx.run_cleanups()

    if error is not None:
        if st.draining.is_set():
            # The process is being stopped (a plain scancel signals every process of the task,
            # sandboxes included): the error is likely the stop's, so another worker retries it.
            log.warning("job %s: %s raised while this worker drains; handing it back", job_id, name)
            return _interrupted(st, ctx, InterruptReason.REQUEUE, limit)
        if error["type"] == NO_BACKEND:
            return _wait_for_backend(st, ctx, error)
        return _finish(st, job_id, name, JobStatus.FAILED, error, ctx.partial, guard, request.group_id)
    if interrupted is None and ctx.interrupted in (InterruptReason.CANCELLED, InterruptReason.SUPERSEDED):
        interrupted = ctx.interrupted  # arrived just as the handler returned: it wins
    if interrupted is not None:
        return _interrupted(st, ctx, interrupted, limit)
    return _hand_on(st, stage, ctx, output)


def _worker_name(st: WorkerState) -> str:
    """The rq worker (one slot) running this attempt, recorded on the job; the process outside rq."""
    job = get_current_job()
    return (job.worker_name if job is not None else None) or st.process_name


def _perform(stage: Stage, ctx: StageContext, workspaces: Path) -> Performed:
    """Call the stage: its output, or why it stopped, or what it raised."""
    try:
        kind = get_kind(ctx.task["kind"])
        ctx.check()
        output = stage.call(kind, ctx)
        if not isinstance(output, dict):
            raise TypeError(f"{type(kind).__name__}.{stage.name} returned {type(output).__name__}, expected a dict")
        return output, None, None
    except StageInterrupted as stop:
        return {}, stop.reason, None
    except JobTimeoutException:
        return {}, InterruptReason.TIMED_OUT, None  # rq's backstop fired: the handler ignored its deadline
    except (RedisConnectionError, RedisTimeoutError) as exc:
        # Redis was away past the client's retries: not the task's fault, so the job goes back to
        # its queue for another attempt (or, if Redis is still away, rq's failure path retries it).
        log.warning("job %s: Redis unreachable in %s (%s); handing the job back", ctx.job_id, stage.name, exc)
        return {}, InterruptReason.REQUEUE, None
    except NoBackendAvailable as exc:  # infrastructure, not the job's fault: it waits (_wait_for_backend)
        return {}, None, {"stage": stage.name, "type": NO_BACKEND, "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - whatever a stage raises fails the job with its type and message
        if write_refusal(exc) is not None:  # Redis up but refusing writes (disk full): as if it were away
            log.warning("job %s: Redis refuses writes in %s (%s); handing the job back", ctx.job_id, stage.name, exc)
            return {}, InterruptReason.REQUEUE, None
        log.warning("job %s: %s failed: %s: %s", ctx.job_id, stage.name, type(exc).__name__, exc)
        message = str(exc) + _disk_full_note(exc, workspaces)
        return (
            {},
            None,
            {"stage": stage.name, "type": _error_type(exc), "message": message, "traceback": traceback.format_exc()},
        )


def _error_type(exc: BaseException) -> str:
    """The job's `error.type`: a JobInputError's own (prompt_too_long, ...), else the exception's class name."""
    return exc.error_type if isinstance(exc, JobInputError) else type(exc).__name__


def _disk_full_note(exc: BaseException, workspaces: Path) -> str:
    """For a full disk or quota, how full the filesystems a stage writes on are.

    A buffered write fails at its flush, whose OSError carries no file name: "[Errno 28] No space
    left on device" alone does not say whether the shared workspaces or this node's temp dir is full.
    """
    if not isinstance(exc, OSError) or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return ""
    parts = []
    for what, path in (("workspaces", workspaces), ("node-local temp", Path(tempfile.gettempdir()))):
        try:
            fs = os.statvfs(path)
        except OSError:
            continue
        parts.append(f"{what} {path}: {fs.f_bavail * fs.f_frsize} of {fs.f_blocks * fs.f_frsize} bytes free")
    return f" ({'; '.join(parts)})" if parts else ""


def _not_taken(job_id: str, stage: str, current: str) -> Outcome:
    """The job is not this stage's to run: gone, over (cancelled while queued: its state goes), or past it."""
    if not current:
        log.warning("job %s: no record (expired or deleted); skipping %s", job_id, stage)
        return Outcome(AttemptResult.MISSING, Ended("", moved=False))
    if current in TERMINAL:
        return Outcome(AttemptResult.SKIPPED.at(current), Ended(current, moved=False))
    # Past this stage, or still in the one before (a superseded attempt queued this one): the
    # attempt that owns the job queues this stage again when it hands the job on.
    log.info("job %s: status %s is not %s's to take; nothing to do", job_id, current, stage)
    return Outcome(AttemptResult.SKIPPED.at(current))


def _hand_on(st: WorkerState, stage: Stage, ctx: StageContext, output: dict[str, Any]) -> Outcome:
    """Record the stage's output and queue the next stage, in one transaction; after the last, done."""
    job_id, name = ctx.job_id, stage.name
    guard = (attempts_field(name), ctx.attempt)
    now = time.time()
    next_stage = NEXT_STAGE[name]
    fields: dict[str, Any] = {time_field(name, "ended"): now}
    try:
        fields.update(_output_fields(st, job_id, name, output, ctx.attempt))
        fields.update(stage.summary_fields(output))
    except ResultsUnavailable as exc:
        # The output cannot be kept: the job fails with the store's fault, never a reward.
        log.error("job %s: %s output not stored: %s", job_id, name, exc)
        error = {"stage": name, "type": "results_unavailable", "message": str(exc)}
        return _finish(st, job_id, name, JobStatus.FAILED, error, None, guard, ctx.request.group_id)
    stage.record(output, st.metrics)
    what = f"job {job_id}: the {name} result"
    if next_stage is None:
        done = JobStatus.DONE
        moved = until_written(lambda: st.store.transition(job_id, (name,), done, fields, guard), what, st.draining)
        if moved.applied:
            return Outcome(AttemptResult.DONE, Ended(JobStatus.DONE, moved=True, group_id=ctx.request.group_id))
        return _lost_race(moved.previous)
    fields[time_field(next_stage, "queued")] = now
    applied, previous = until_written(lambda: _queue_next(st, ctx, next_stage, fields, guard), what, st.draining)
    if applied:
        return Outcome(AttemptResult.QUEUED.at(next_stage))
    return _lost_race(previous.decode() if isinstance(previous, bytes) else previous)


def _queue_next(
    st: WorkerState, ctx: StageContext, next_stage: str, fields: dict[str, Any], guard: tuple[str, int]
) -> tuple[Any, Any]:
    """Queue the next stage and move the job there; (applied, previous status) of the move."""
    with st.redis.pipeline(transaction=True) as pipe:
        # Queued even if the move is refused: the next stage's worker then finds the job
        # cancelled or already taken and skips it. One transaction, so never the reverse.
        enqueue_stage(pipe, next_stage, [(ctx.job_id, ctx.request.limits)], st.settings, st.redis)
        st.store.queue_transition(pipe, ctx.job_id, (ctx.stage,), next_stage, fields, guard)
        applied, previous = pipe.execute()[-1][:2]
    return applied, previous


def _hand_back(st: WorkerState, ctx: StageContext, guard: tuple[str, int]) -> None:
    """Queue the job's stage again (a new attempt) and note when it was handed back, in one transaction."""
    with st.redis.pipeline(transaction=True) as pipe:
        enqueue_stage(pipe, ctx.stage, [(ctx.job_id, ctx.request.limits)], st.settings, st.redis, handback=ctx.attempt)
        requeued = {time_field(ctx.stage, "requeued"): time.time()}
        st.store.queue_transition(pipe, ctx.job_id, (ctx.stage,), ctx.stage, requeued, guard)
        pipe.execute()


def _output_fields(st: WorkerState, job_id: str, stage: str, output: dict[str, Any], attempt: int) -> dict[str, Any]:
    """The record fields of a stage's output: a large one (the trajectory, the evaluation) goes to the
    results store, in the attempt's own file, and the record keeps its reference (and the reward);
    a small one stays inline."""
    if stage not in STORED_PARTS:
        return {output_field(stage): output}
    fields = st.store.store_part(job_id, stage, output, attempt)
    if stage == "eval":
        fields["reward"] = output.get("reward")
    return fields


def _partial_fields(
    st: WorkerState, job_id: str, partial: dict[str, Any] | None, attempt: int | None
) -> dict[str, Any]:
    """Where a stopped stage's partial output goes: the results store, like a finished one."""
    if not partial:
        return {}
    return st.store.store_part(job_id, "partial", partial, attempt)


def _lost_race(current: str) -> Outcome:
    """The move was refused: the job was cancelled or deleted meanwhile (its state goes now), or a
    newer attempt owns it (and its workspace: left alone)."""
    if current in TERMINAL or not current:
        return Outcome(AttemptResult.LOST_RACE.at(current or AttemptResult.MISSING.value), Ended(current, moved=False))
    return Outcome(AttemptResult.LOST_RACE.at(current))


def _interrupted(st: WorkerState, ctx: StageContext, reason: str, limit: str) -> Outcome:
    job_id, stage = ctx.job_id, ctx.stage
    guard = (attempts_field(stage), ctx.attempt)
    if reason == InterruptReason.SUPERSEDED:
        # A newer attempt at this stage owns the job (and its workspace): leave both alone.
        log.warning("job %s: %s attempt %d superseded by a newer one; dropping it", job_id, stage, ctx.attempt)
        return Outcome(AttemptResult.SUPERSEDED)
    if reason == InterruptReason.REQUEUE:
        # The worker is shutting down (or Redis failed the stage): hand the job back to its stage's queue.
        until_written(lambda: _hand_back(st, ctx, guard), f"job {job_id}: handing {stage} back", st.draining)
        return Outcome(AttemptResult.REQUEUED)
    if reason == InterruptReason.TIMED_OUT:
        error = _timeout_error(stage, limit)
        return _finish(st, job_id, stage, JobStatus.TIMED_OUT, error, ctx.partial, guard, ctx.request.group_id)
    # cancelled: the API already set the status (and told the batch); record where it stopped.
    fields: dict[str, Any] = {time_field(stage, "ended"): time.time()}
    try:
        fields.update(_partial_fields(st, job_id, ctx.partial, ctx.attempt))
    except ResultsUnavailable as exc:
        log.error("job %s: partial output of the cancelled %s not stored: %s", job_id, stage, exc)
    until_written(lambda: st.store.set_fields(job_id, fields), f"job {job_id}: where {stage} stopped", st.draining)
    return Outcome(AttemptResult.CANCELLED, Ended(JobStatus.CANCELLED, moved=False))


def _wait_for_backend(st: WorkerState, ctx: StageContext, error: dict[str, Any]) -> Outcome:
    """No LLM backend is open to the job: hand it back to wait outside the slots
    (shared/jobs/backend_wait.py), or fail it once it has waited `backend_wait_s`."""
    job_id, stage = ctx.job_id, ctx.stage
    plan = plan_wait(st.store, job_id, stage, ctx.attempt, time.time())
    if plan.expired:
        message = (
            f"no LLM backend was open to this job for {plan.waited_s:.0f} s "
            f"(backend_wait_s = {st.settings.backend_wait_s:g}); last: {error['message']}"
        )
        guard = (attempts_field(stage), ctx.attempt)
        return _finish(
            st, job_id, stage, JobStatus.FAILED, {**error, "message": message}, ctx.partial, guard, ctx.request.group_id
        )
    refused = park(st.store, job_id, stage, ctx.attempt, plan)
    if refused is not None:
        return _lost_race(refused)  # cancelled or deleted meanwhile, or a newer attempt owns it
    log.info("job %s: no LLM backend open to it; waiting (%.0f s so far)", job_id, plan.waited_s)
    return Outcome(AttemptResult.WAITING_FOR_BACKEND)


def _finish(
    st: WorkerState,
    job_id: str,
    stage: str,
    status: JobStatus,
    error: dict[str, Any],
    partial: dict[str, Any] | None,
    guard: tuple[str, int] | None,
    group_id: str | Unknown | None,
) -> Outcome:
    fields: dict[str, Any] = {time_field(stage, "ended"): time.time()}
    try:
        fields.update(_partial_fields(st, job_id, partial, guard[1] if guard else None))
    except ResultsUnavailable as exc:
        error = {**error, "message": f"{error.get('message', '')} (its partial output was not stored: {exc})"}
    fields["error"] = error
    what = f"job {job_id}: its {status} record"
    moved = until_written(lambda: st.store.transition(job_id, "*", status, fields, guard), what, st.draining)
    if moved.applied:
        return Outcome(status, Ended(status, moved=True, error=error, group_id=group_id))
    if moved.previous == AttemptResult.SUPERSEDED:
        return Outcome(AttemptResult.SUPERSEDED)
    return Outcome(status, Ended(moved.previous, moved=False))  # cancelled or deleted meanwhile


def _timeout_error(stage: str, which: str) -> dict[str, Any]:
    limit = "total wall-time limit" if which == "total" else f"{stage} stage time limit"
    return {"stage": stage, "type": "timeout", "message": f"job exceeded its {limit}"}
