"""Response shapes of the jobs API (requests are shared.jobs.spec, shared with the workers; the views are
built by shared/jobs/views.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Submitted(BaseModel):
    job_ids: list[str] = Field(description="One id per submitted job, in request order.")
    created: list[bool] = Field(description="False where an idempotency key matched an existing job.")
    agent: list[dict[str, str] | None] | None = Field(
        default=None,
        description="Present when a job has `agent: external`: per job, its agent's `base_url` and "
        "`api_key` (null for the others).",
    )


class StageTimings(BaseModel):
    queued: float | None = None
    started: float | None = None
    ended: float | None = None
    requeued: float | None = None
    waiting: float | None = Field(default=None, description="Since when the stage waits for an LLM backend.")


class JobResult(BaseModel):
    reward: float | None = None
    trajectory: dict[str, Any] = Field(default_factory=dict, description="What the rollout stage returned.")
    evaluation: dict[str, Any] = Field(default_factory=dict, description="What the eval stage returned.")


class JobHeader(BaseModel):
    """What every view of a job starts with."""

    id: str
    status: str
    kind: str
    group_id: str | None = None
    sample_index: int | None = None
    created_at: float
    updated_at: float
    finished_at: float | None = None
    status_detail: str | None = Field(
        default=None, description="What the job does within its status: `waiting for an LLM backend`, or null."
    )


class JobView(JobHeader):
    timings: dict[str, StageTimings] = Field(default_factory=dict, description="Unix times per stage.")
    attempts: dict[str, int] = Field(default_factory=dict, description="Times each stage was started.")
    workers: dict[str, str] = Field(default_factory=dict, description="The worker that ran each stage last.")
    lost: dict[str, int] = Field(
        default_factory=dict, description="Times a stage's worker died (or lost Redis) mid-job and it was re-queued."
    )
    failovers: dict[str, int] = Field(
        default_factory=dict,
        description="Per LLM backend, the model calls it failed (it died, restarted or answered "
        "unusably) that went on to another backend or waited for one.",
    )
    sandboxes: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="Per stage and attempt, the id of the sandbox it used (`<host>-<pid>.<start>-<random>`; "
        "its runtime dir on that host is `ro-<pid>.<start>-<random>`), named as it opened.",
    )
    result: JobResult | None = Field(default=None, description="Present once the job is done.")
    error: dict[str, Any] | None = Field(default=None, description="Why it failed, timed out or was cancelled.")
    partial: dict[str, Any] | None = Field(default=None, description="What a stage had when it was cut short.")
    request: dict[str, Any] = Field(description="The job as submitted.")
    agent: dict[str, str] | None = Field(
        default=None, description="An `agent: external` job's endpoint for its agent: `base_url` and `api_key`."
    )


class JobSummary(JobHeader):
    reward: float | None = None


class JobList(BaseModel):
    jobs: list[JobSummary]
    limit: int
    offset: int
    next_cursor: str | None = Field(default=None, description="Pass as `cursor` for the next page; null on the last.")


class Cancelled(BaseModel):
    id: str
    status: str
    previous: str = Field(description="The status the job was in when cancelled.")
