"""Run one stage of one job: take it, call the task kind, record the outcome, hand it on.

This is the body of every rq job. It never lets an exception escape: a task's
error becomes a `failed` record with the traceback, an interruption becomes
`cancelled`, `timed_out` or a hand-back to the same queue. rq's own retry is
left for the one case the runner cannot see: its process dying mid-job.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from rq.timeouts import JobTimeoutException

from shared.config import STAGES
from shared.jobs.queues import enqueue_stage, stage_timeout, total_timeout
from shared.jobs.status import NEXT_STAGE, STAGE_ENTRY_FROM, TERMINAL
from shared.tasks import StageContext, StageInterrupted, get_kind
from workers.runtime.state import WorkerState, log, state


def run_stage(stage: str, job_id: str, worker_name: str | None = None) -> str:
    """Run `stage` for `job_id`; returns what happened (for logs and tests)."""
    st = state()
    record = st.store.get(job_id)
    if record is None:
        log.warning("job %s: no record (expired or deleted); skipping %s", job_id, stage)
        return "missing"
    status = record["status"]
    if status in TERMINAL:
        # Cancelled (or finished) while queued for this stage: it never runs; tidy up its state.
        st.remove_workspace(job_id)
        return f"skipped:{status}"
    if status not in STAGE_ENTRY_FROM[stage]:
        log.info("job %s: status %s is past %s; nothing to do", job_id, status, stage)
        return f"skipped:{status}"

    spec = record["spec"]
    now = time.time()
    job_deadline = record["created_at"] + total_timeout(spec, st.settings)
    if now >= job_deadline:
        _finish(st, job_id, stage, "timed_out", _timeout_error(stage, "total"), partial=None)
        return "timed_out"

    taken = st.store.transition(
        job_id,
        STAGE_ENTRY_FROM[stage],
        stage,
        {f"t:{stage}:started": now, f"worker:{stage}": worker_name or st.process_name},
    )
    if not taken.applied:
        if taken.previous in TERMINAL:
            st.remove_workspace(job_id)
        return f"skipped:{taken.previous or 'missing'}"
    st.redis.hincrby(st.store.keys.job(job_id), f"attempts:{stage}", 1)

    ctx = StageContext(
        job_id=job_id,
        stage=stage,
        spec=spec,
        outputs={s: record[f"out:{s}"] for s in STAGES if f"out:{s}" in record},
        workspace=st.workspace(job_id),
        settings=st.settings,
        deadline=min(now + stage_timeout(spec, stage, st.settings), job_deadline),
    )
    st.inflight.add(ctx)
    try:
        output = _call_handler(stage, ctx)
    except StageInterrupted as stop:
        return _interrupted(st, ctx, stop.reason)
    except JobTimeoutException:
        # rq's backstop fired: the handler ignored its deadline.
        _finish(st, job_id, stage, "timed_out", _timeout_error(stage, "stage"), ctx.partial)
        return "timed_out"
    except Exception as exc:
        error = {
            "stage": stage,
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
        }
        log.warning("job %s: %s failed: %s: %s", job_id, stage, type(exc).__name__, exc)
        _finish(st, job_id, stage, "failed", error, ctx.partial)
        return "failed"
    finally:
        st.inflight.remove(ctx)
        ctx.run_cleanups()

    if ctx.interrupted == "cancelled":  # cancelled just as the handler returned: the cancel wins
        return _interrupted(st, ctx, "cancelled")
    return _hand_on(st, job_id, stage, spec, output)


def _call_handler(stage: str, ctx: StageContext) -> dict[str, Any]:
    kind = get_kind(ctx.task["kind"])
    ctx.check()
    if stage == "init":
        output = kind.init(ctx)
    elif stage == "rollout":
        output = kind.rollout(ctx)
    else:
        output = kind.evaluate(ctx)
    if not isinstance(output, dict):
        raise TypeError(f"{type(kind).__name__}.{stage} returned {type(output).__name__}, expected a dict")
    return output


def _hand_on(st: WorkerState, job_id: str, stage: str, spec: dict[str, Any], output: dict[str, Any]) -> str:
    """Record the stage's output and queue the next stage, in one transaction."""
    now = time.time()
    next_stage = NEXT_STAGE[stage]
    fields: dict[str, Any] = {f"t:{stage}:ended": now, f"out:{stage}": output}
    if next_stage is None:
        moved = st.store.transition(job_id, (stage,), "done", fields)
        st.remove_workspace(job_id)
        return "done" if moved.applied else f"lost-race:{moved.previous}"
    fields[f"t:{next_stage}:queued"] = now
    with st.redis.pipeline(transaction=True) as pipe:
        enqueue_stage(pipe, next_stage, [(job_id, spec)], st.settings, st.redis)
        st.store.queue_transition(pipe, job_id, (stage,), next_stage, fields)
        applied, previous = pipe.execute()[-1]
    if not applied:
        # Cancelled meanwhile: the next stage's worker will see it and skip; the state goes now.
        st.remove_workspace(job_id)
        return f"lost-race:{previous.decode() if isinstance(previous, bytes) else previous}"
    return f"queued:{next_stage}"


def _interrupted(st: WorkerState, ctx: StageContext, reason: str) -> str:
    job_id, stage = ctx.job_id, ctx.stage
    if reason == "requeue":
        # The worker is shutting down: hand the job back to its stage's queue for another worker.
        with st.redis.pipeline(transaction=True) as pipe:
            enqueue_stage(pipe, stage, [(job_id, ctx.spec)], st.settings, st.redis)
            st.store.queue_transition(pipe, job_id, (stage,), stage, {f"t:{stage}:requeued": time.time()})
            pipe.execute()
        return "requeued"
    if reason == "timed_out":
        _finish(st, job_id, stage, "timed_out", _timeout_error(stage, "stage"), ctx.partial)
        return "timed_out"
    # cancelled: the API already set the status; record where it stopped and clean up.
    st.store.set_fields(job_id, {f"t:{stage}:ended": time.time(), "partial": ctx.partial})
    st.remove_workspace(job_id)
    return "cancelled"


def _finish(
    st: WorkerState,
    job_id: str,
    stage: str,
    status: str,
    error: dict[str, Any],
    partial: dict[str, Any] | None,
) -> None:
    fields: dict[str, Any] = {f"t:{stage}:ended": time.time(), "error": error}
    if partial:
        fields["partial"] = partial
    st.store.transition(job_id, "*", status, fields)
    st.remove_workspace(job_id)


def _timeout_error(stage: str, which: str) -> dict[str, Any]:
    limit = "total wall-time limit" if which == "total" else f"{stage} stage time limit"
    return {"stage": stage, "type": "timeout", "message": f"job exceeded its {limit}"}
