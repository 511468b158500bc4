"""Typed results: what the API's JSON/msgpack payloads mean, as dataclasses a trainer can rely on."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class _Word(str, Enum):
    """A status word: equal to its plain string, and printed as it."""

    def __str__(self) -> str:
        return self.value


class JobStatus(_Word):
    """A job's status as the API reports it; a str enum, so `job.status == JobStatus.DONE` holds for the
    plain string too. The service's own (shared/jobs/status.py) has the same members: a test compares them."""

    QUEUED = "queued"  # accepted, waiting for an init worker
    INIT = "init"  # in a stage: waiting in its queue or running
    ROLLOUT = "rollout"
    EVAL = "eval"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


class BatchStatus(_Word):
    """A batch's status: running until its target is met, its prompts run out, or it is cancelled."""

    RUNNING = "running"
    COMPLETED = "completed"
    EXHAUSTED = "exhausted"
    CANCELLED = "cancelled"


TERMINAL_STATUSES: frozenset[str] = frozenset(
    {JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.TIMED_OUT}
)  # a job in one of these never changes again


@dataclass(frozen=True)
class Job:
    """One job (trajectory). `result` (trajectory, evaluation, reward) is set once it is done."""

    id: str
    status: str  # a JobStatus
    kind: str = ""
    group_id: str | None = None
    sample_index: int | None = None
    reward: float | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    created_at: float = 0.0
    finished_at: float | None = None
    status_detail: str | None = None  # "waiting for an LLM backend" while it does
    agent: dict[str, str] | None = None  # an `agent: external` job's endpoint: base_url and api_key
    failovers: dict[str, int] = field(default_factory=dict)  # per LLM backend, model calls it failed
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def trajectory(self) -> dict[str, Any] | None:
        return (self.result or {}).get("trajectory")

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Job:
        result = data.get("result")
        reward = data.get("reward") if "reward" in data else (result or {}).get("reward")
        return cls(
            id=data["id"],
            status=data["status"],
            kind=data.get("kind", ""),
            group_id=data.get("group_id"),
            sample_index=data.get("sample_index"),
            reward=reward,
            result=result,
            error=data.get("error"),
            created_at=data.get("created_at", 0.0),
            finished_at=data.get("finished_at"),
            status_detail=data.get("status_detail"),
            agent=data.get("agent"),
            failovers=data.get("failovers") or {},
            raw=data,
        )


@dataclass(frozen=True)
class JobsProgress:
    """One answer while waiting for jobs (watch_jobs): summaries, no results."""

    ended: list[Job]  # the jobs that ended since the last answer
    running: list[Job]  # the jobs still running
    unlisted: list[str]  # ids the service did not list (unknown to it, or expired): their record says why

    @property
    def moved(self) -> bool:
        """Whether a job left the wait with this answer (ended, or unlisted)."""
        return bool(self.ended or self.unlisted)

    @classmethod
    def of(cls, asked: list[str], summaries: list[Job]) -> JobsProgress:
        listed = {job.id for job in summaries}
        return cls(
            ended=[job for job in summaries if job.finished],
            running=[job for job in summaries if not job.finished],
            unlisted=[job_id for job_id in asked if job_id not in listed],
        )


@dataclass(frozen=True)
class Sample:
    sample_index: int
    job_id: str | None
    status: str | None
    reward: float | None
    advantage: float | None = None
    result: dict[str, Any] | None = None  # with results=True: trajectory, evaluation, reward

    @property
    def trajectory(self) -> dict[str, Any] | None:
        return (self.result or {}).get("trajectory")


@dataclass(frozen=True)
class Group:
    """One completed GRPO group. `used` groups count toward the batch's target (train on these)."""

    batch_id: str
    group_id: str
    prompt_index: int
    outcome: str  # informative, uniform (all rewards equal) or failed
    used: bool
    rewards: list[float | None]
    mean: float | None
    std: float | None
    advantages: list[float | None] | None
    samples: list[Sample]
    prompt: dict[str, Any] | None = None
    error: str | None = None
    launched_at: float | None = None
    completed_at: float | None = None
    cursor: str | None = None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Group:
        advantages = data.get("advantages")
        samples = [
            Sample(
                sample_index=s["sample_index"],
                job_id=s.get("job_id"),
                status=s.get("status"),
                reward=s.get("reward"),
                advantage=advantages[i] if advantages else None,
                result=s.get("result"),
            )
            for i, s in enumerate(data.get("samples") or [])
        ]
        return cls(
            batch_id=data["batch_id"],
            group_id=data["group_id"],
            prompt_index=data["prompt_index"],
            outcome=data.get("outcome") or "",
            used=bool(data.get("used")),
            rewards=list(data.get("rewards") or []),
            mean=data.get("mean"),
            std=data.get("std"),
            advantages=advantages,
            samples=samples,
            prompt=data.get("prompt"),
            error=data.get("error"),
            launched_at=data.get("launched_at"),
            completed_at=data.get("completed_at"),
            cursor=data.get("cursor"),
        )


@dataclass(frozen=True)
class BatchCounts:
    launched: int = 0
    in_flight: int = 0
    completed: int = 0
    used: int = 0
    informative: int = 0
    uniform: int = 0
    filtered: int = 0
    failed: int = 0
    late: int = 0
    stale: int = 0  # groups with a sample older than the batch's max_staleness: not delivered, replaced
    prompts_left: int = 0


@dataclass(frozen=True)
class Batch:
    id: str
    status: str  # a BatchStatus
    mode: str  # dapo or all
    target: int
    n_samples: int
    pool_size: int
    counts: BatchCounts
    created_at: float
    finished_at: float | None = None
    reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def finished(self) -> bool:
        return self.status != BatchStatus.RUNNING

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Batch:
        known = BatchCounts.__dataclass_fields__
        return cls(
            id=data["id"],
            status=data["status"],
            mode=data["mode"],
            target=data["target"],
            n_samples=data["n_samples"],
            pool_size=data["pool_size"],
            counts=BatchCounts(**{k: v for k, v in (data.get("counts") or {}).items() if k in known}),
            created_at=data["created_at"],
            finished_at=data.get("finished_at"),
            reason=data.get("reason"),
            raw=data,
        )


@dataclass(frozen=True)
class GroupPage:
    """One long-poll answer: the groups after the cursor, the new cursor, and whether the stream ended."""

    batch: Batch
    groups: list[Group]
    cursor: str
    done: bool

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> GroupPage:
        return cls(
            batch=Batch.from_api(data["batch"]),
            groups=[Group.from_api(g) for g in data["groups"]],
            cursor=data["cursor"],
            done=bool(data["done"]),
        )
