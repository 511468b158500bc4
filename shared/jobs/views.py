"""The public shapes of a job (what the API serves and the client parses): the full view and the list summary.

The view is built from a whole record; the summary from a few fields read for many jobs at once (a
long poll reads them every time a job ends), so a list never unpacks a trajectory.
"""

from __future__ import annotations

from typing import Any

from shared.config import STAGES
from shared.jobs.backend_wait import WAITING_DETAIL, is_waiting
from shared.jobs.record_fields import attempts_field, output_field, wait_field
from shared.jobs.status import TERMINAL, JobStatus
from shared.jobs.store import JobStore, decode_record, reward_of

# What a summary reads of each record: its header, the reward, and what `status_detail` needs.
_REWARD_FIELDS = ("reward", output_field("eval"))  # `out:eval`: records written before the results store
SUMMARY_FIELDS = (
    "id",
    "status",
    "kind",
    "group_id",
    "sample_index",
    "created_at",
    "updated_at",
    "finished_at",
    *_REWARD_FIELDS,
    *(field(stage) for stage in STAGES for field in (wait_field, attempts_field)),
)


def _header(record: dict[str, Any]) -> dict[str, Any]:
    """What every view of a job starts with (the API's `JobHeader`)."""
    return {
        "id": record.get("id", ""),
        "status": record.get("status", ""),
        "kind": record.get("kind", ""),
        "group_id": record.get("group_id"),
        "sample_index": record.get("sample_index"),
        "created_at": record.get("created_at", 0.0),
        "updated_at": record.get("updated_at", 0.0),
        "finished_at": record.get("finished_at"),
        "status_detail": WAITING_DETAIL if is_waiting(record) else None,
    }


def job_view(record: dict[str, Any]) -> dict[str, Any]:
    """The public shape of a record (its stored parts read back): stage outputs become `result` once done."""
    view: dict[str, Any] = {
        **_header(record),
        "timings": record["timings"],
        "attempts": record["attempts"],
        "workers": record["workers"],
        "lost": record["lost"],
        "failovers": record["failovers"],
        "sandboxes": record.get("sandboxes", {}),
        "result": None,
        "error": record.get("error"),
        "partial": record.get("partial"),
        "request": record.get("spec") or {},
    }
    if record["status"] == JobStatus.DONE:
        evaluation = record.get(output_field("eval")) or {}
        view["result"] = {
            "reward": evaluation.get("reward"),
            "trajectory": record.get(output_field("rollout")) or {},
            "evaluation": evaluation,
        }
    elif record["status"] in TERMINAL:
        view["partial"] = _with_finished_rollout(view["partial"], record.get(output_field("rollout")))
    return view


def _with_finished_rollout(partial: dict[str, Any] | None, rollout: dict[str, Any] | None) -> dict[str, Any] | None:
    """A job stopped after its rollout (eval failed or timed out) still has the trajectory the rollout
    finished: it is the record up to where the job stopped, so it is served as `partial.trajectory`."""
    if not rollout or (partial and "trajectory" in partial):
        return partial
    return {**(partial or {}), "trajectory": rollout}


def job_summaries(store: JobStore, job_ids: list[str]) -> list[dict[str, Any]]:
    """The jobs' summaries in one pipelined read; a job that is gone (never there, or expired) is left out."""
    with store.redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(store.keys.job(job_id), SUMMARY_FIELDS)
        rows = pipe.execute()
    return [_summary(row) for row in rows if row[0] is not None]


def _summary(row: list[bytes | None]) -> dict[str, Any]:
    """One job's header and, once done, its reward (the API's `JobSummary`)."""
    values = dict(zip(SUMMARY_FIELDS, row))
    scalars = {name.encode(): value for name, value in values.items() if value is not None}
    for name in _REWARD_FIELDS:  # blobs: unpacked only for a done job, below
        scalars.pop(name.encode(), None)
    summary = _header(decode_record(scalars))
    reward = reward_of(*(values[name] for name in _REWARD_FIELDS)) if summary["status"] == JobStatus.DONE else None
    summary["reward"] = float(reward) if reward is not None else None
    return summary
