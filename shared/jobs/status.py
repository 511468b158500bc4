"""Job statuses and which transitions are legal between them."""

from __future__ import annotations

from shared.words import Word


class JobStatus(Word):
    """A job's status (a `Word`: equal to its value, which is what Redis and JSON hold)."""

    QUEUED = "queued"  # accepted, waiting for an init worker
    INIT = "init"  # in the init stage (queued for it or running)
    ROLLOUT = "rollout"
    EVAL = "eval"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


class AttemptResult(Word):
    """What one stage attempt did: the stage runner's answer, in logs, metrics and tests.

    QUEUED, LOST_RACE and SKIPPED are prefixes: `.at(where)` adds the next stage or the status found
    ("queued:eval", "lost-race:cancelled", "skipped:done").
    """

    DONE = "done"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"  # a newer attempt owns the job (fencing); also what transition.lua answers
    REQUEUED = "requeued"  # handed back to its queue (a draining worker, a Redis outage)
    WAITING_FOR_BACKEND = "waiting_for_backend"  # handed back to wait for an LLM backend
    MISSING = "missing"  # the record is gone
    QUEUED = "queued"
    LOST_RACE = "lost-race"
    SKIPPED = "skipped"

    def at(self, where: str) -> str:
        """The result with what it refers to: the next stage, or the status the attempt found."""
        return f"{self.value}:{where}"


TERMINAL: frozenset[str] = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.TIMED_OUT})
ALL_STATUSES: tuple[str, ...] = tuple(s.value for s in JobStatus)

# A stage worker may take a job whose status is its stage: the hand-over moved it there in the
# same transaction that stored the previous stage's output, and a re-run after a worker died finds
# it there still. `init` also takes a job from `queued`, where submission leaves it. A job still in
# the stage before is never taken: a rollout queued by a superseded init attempt (whose move was
# refused) would otherwise run without the init output the newer attempt has not yet stored.
STAGE_ENTRY_FROM: dict[str, tuple[str, ...]] = {
    "init": (JobStatus.QUEUED, JobStatus.INIT),
    "rollout": (JobStatus.ROLLOUT,),
    "eval": (JobStatus.EVAL,),
}
NEXT_STAGE: dict[str, str | None] = {"init": "rollout", "rollout": "eval", "eval": None}
