"""Job statuses and which transitions are legal between them."""

from __future__ import annotations

from enum import Enum


class JobStatus(str, Enum):
    QUEUED = "queued"  # accepted, waiting for an init worker
    INIT = "init"  # in the init stage (queued for it or running)
    ROLLOUT = "rollout"
    EVAL = "eval"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


TERMINAL: frozenset[str] = frozenset({"done", "failed", "cancelled", "timed_out"})
ALL_STATUSES: tuple[str, ...] = tuple(s.value for s in JobStatus)

# A stage worker may take a job whose status is the stage before it (normal
# hand-over) or the stage itself (a re-run after its previous worker died).
STAGE_ENTRY_FROM: dict[str, tuple[str, ...]] = {
    "init": ("queued", "init"),
    "rollout": ("init", "rollout"),
    "eval": ("rollout", "eval"),
}
NEXT_STAGE: dict[str, str | None] = {"init": "rollout", "rollout": "eval", "eval": None}
