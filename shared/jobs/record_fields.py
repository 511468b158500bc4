"""The names of a job record's per-stage fields (the record is a Redis hash), built here and only here.

`decode_record` (shared/jobs/store.py) groups them back by their prefix; take.lua builds three of
them itself (`t:<stage>:started`, `worker:<stage>`, `attempts:<stage>`), and a test holds it to
these functions.
"""

from __future__ import annotations

from shared.config import STAGES


def output_field(stage: str) -> str:
    """A stage's output, in place of its `ref:` once read back from the results store."""
    return f"out:{stage}"


def ref_field(part: str) -> str:
    """Where a stored part (a stage's output, `partial`) lies in the results store."""
    return f"ref:{part}"


def attempts_field(stage: str) -> str:
    """How many attempts took the stage: the current attempt's fencing token."""
    return f"attempts:{stage}"


def time_field(stage: str, event: str) -> str:
    """When the stage's `event` happened (queued, started, ended, requeued, waiting), epoch seconds."""
    return f"t:{stage}:{event}"


def wait_field(stage: str) -> str:
    """The attempt that handed the job back to wait for an LLM backend."""
    return f"wait:{stage}"


def worker_field(stage: str) -> str:
    """The worker process that took the stage last."""
    return f"worker:{stage}"


def sandbox_field(stage: str, attempt: int) -> str:
    """The sandbox an attempt at the stage used (its id, workers/sandbox/owner.py), written as it opens."""
    return f"sandbox:{stage}:{attempt}"


def lost_field(stage: str) -> str:
    """How many of the stage's workers were lost (killed, given up for dead)."""
    return f"lost:{stage}"


# A finished rollout's few numbers (tokens, LLM time, versions, sandbox), kept by the rollout stage
# so a job's end adds them to the run page's aggregates without reading the results store.
ROLLOUT_SUMMARY = "rollout_summary"

OUTPUT_FIELDS: tuple[str, ...] = tuple(output_field(stage) for stage in STAGES)
