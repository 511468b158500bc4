"""Job statuses and which transitions are legal between them."""

from __future__ import annotations

from enum import Enum


class JobStatus(str, Enum):
    """A str enum: members compare equal to, and are stored in Redis and JSON as, their values."""

    QUEUED = "queued"  # accepted, waiting for an init worker
    INIT = "init"  # in the init stage (queued for it or running)
    ROLLOUT = "rollout"
    EVAL = "eval"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    def __str__(self) -> str:
        # The value, as 3.11's StrEnum gives (3.10 is supported): statuses go into f-strings and logs.
        return self.value


TERMINAL: frozenset[str] = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.TIMED_OUT})
ALL_STATUSES: tuple[str, ...] = tuple(s.value for s in JobStatus)

# A stage worker may take a job whose status is the stage before it (normal
# hand-over) or the stage itself (a re-run after its previous worker died).
STAGE_ENTRY_FROM: dict[str, tuple[str, ...]] = {
    "init": (JobStatus.QUEUED, JobStatus.INIT),
    "rollout": (JobStatus.INIT, JobStatus.ROLLOUT),
    "eval": (JobStatus.ROLLOUT, JobStatus.EVAL),
}
NEXT_STAGE: dict[str, str | None] = {"init": "rollout", "rollout": "eval", "eval": None}
