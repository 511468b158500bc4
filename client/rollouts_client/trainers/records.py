"""A finished job's token-exact record as the trainer's split: prompt = the first turn's span, response = the rest.

Nothing is re-tokenized: the response is `token_ids[prompt_length:]`, its mask the record's
`loss_mask` (1 exactly on generated tokens) and its logprobs the backend's (0.0 where the
mask is 0, as both trainers pad them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rollouts_client.errors import RolloutsClientError
from rollouts_client.models import Job

FAILED = frozenset({"failed", "timed_out", "cancelled"})
# A failed job's `error.type`s that say its input cannot run (the service's JobInputError types): a retry
# would fail the same way, so the bridge raises at once.
INPUT_ERRORS = frozenset({"prompt_too_long"})
_STEP_VERSION = re.compile(r"step-(\d+)")  # engines.step_version's form


class JobFailed(RolloutsClientError, RuntimeError):
    """A job that ended without a result (infrastructure, time limit, cancel or evaluation error): never a reward."""

    def __init__(self, job: Job, attempts: int, row: str | None = None) -> None:
        error = job.error or {}
        detail = error.get("message") or error.get("type") or job.status
        kind = f" ({error['type']})" if input_error(job) else ""
        where = f"row {row}: " if row is not None else ""
        super().__init__(f"{where}job {job.id} ended {job.status}{kind} after {attempts} attempt(s): {detail}")
        self.job = job
        self.attempts = attempts


def input_error(job: Job) -> bool:
    """The failed job's own input cannot run (prompt_too_long, ...): retrying it would fail again."""
    return (job.error or {}).get("type") in INPUT_ERRORS


class SegmentedRecord(RolloutsClientError, ValueError):
    """A record with other segments (an external agent rewrote its history or held several conversations), refused
    by `on_segments: raise`."""


@dataclass(frozen=True)
class Split:
    """One record in the trainer's shape, with what the trainer keeps beside the tensors."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    token_rewards: list[float] | None  # over the response: the record's or the evaluation's `token_rewards`
    num_turns: int
    stop_reason: str
    weight_versions: list[dict[str, Any]] = field(default_factory=list)  # one per assistant turn
    earlier_segments: int = 0  # every other segment of the record (other conversations' included)
    conversation: str | None = None  # an external agent's conversation of the trained segment (the last call's)
    timings: dict[str, float] = field(default_factory=dict)


def split_record(job: Job, on_segments: str = "last") -> Split:
    """The done job's record, split at its prompt; SegmentedRecord if it has earlier segments and they are refused.

    One sequence per row (SkyRL, TRL, verl's legacy worker): `on_segments` "last" or "raise"; "all" is refused
    here, since only a trainer that takes several sequences per row (verl's V1 worker) can use it.
    """
    if on_segments == "all":
        raise ValueError("on_segments: all needs a trainer that takes several sequences per row (verl's V1 worker)")
    return split_segments(job, on_segments)[-1]


def split_segments(job: Job, on_segments: str = "all") -> list[Split]:
    """The record's segments to train on, oldest first, the last call's (the evaluated one) last: every segment
    ("all"), only the last ("last"), or SegmentedRecord when there are earlier ones ("raise")."""
    record = _record(job)
    segments = record.get("segments") or []
    if segments and on_segments == "raise":
        raise SegmentedRecord(
            f"job {job.id}: the record has {len(segments)} earlier segment(s) (the agent rewrote its history or "
            "held several conversations); "
            "a trainer row holds one sequence, so it is refused (on_segments: raise)"
        )
    evaluation = (job.result or {}).get("evaluation") or {}
    last = _split(job.id, record, record.get("token_rewards", evaluation.get("token_rewards")), len(segments))
    if on_segments != "all":
        return [last]
    earlier = [_split(job.id, s, s.get("token_rewards"), len(segments)) for s in segments]
    return [*earlier, last]


def _record(job: Job) -> dict[str, Any]:
    record = job.trajectory
    if not record or "token_ids" not in record:
        raise ValueError(f"job {job.id}: no trajectory in its result")
    return record


def _split(job_id: str, record: dict[str, Any], own_rewards: list[Any] | None, earlier_segments: int) -> Split:
    """One segment (a whole record of its own) split at its prompt; `own_rewards` its per-token rewards, if any."""
    tokens, mask, logprobs = record["token_ids"], record["loss_mask"], record["logprobs"]
    turns = record.get("turns") or []
    start = int(record.get("prompt_length") or (turns[0]["end"] if turns else 0))
    if not 0 < start <= len(tokens) or not (len(mask) == len(logprobs) == len(tokens)):
        raise ValueError(f"job {job_id}: malformed record ({len(tokens)} tokens, prompt {start})")
    if own_rewards is not None and len(own_rewards) != len(tokens):
        raise ValueError(f"job {job_id}: {len(own_rewards)} token_rewards for {len(tokens)} tokens")
    return Split(
        prompt_ids=list(tokens[:start]),
        response_ids=list(tokens[start:]),
        response_mask=[int(m) for m in mask[start:]],
        response_logprobs=[0.0 if lp is None else float(lp) for lp in logprobs[start:]],
        token_rewards=None if own_rewards is None else [float(r or 0.0) for r in own_rewards[start:]],
        num_turns=len(turns),
        stop_reason=str(record.get("stop_reason") or ""),
        weight_versions=[
            {"turn": i, "policy_version": t.get("policy_version"), "weight_versions": t.get("weight_versions") or []}
            for i, t in enumerate(turns)
            if t.get("role") == "assistant"
        ],
        earlier_segments=earlier_segments,
        conversation=record.get("conversation"),
        timings={k: float(v) for k, v in (record.get("timings") or {}).items() if isinstance(v, (int, float))},
    )


def step_range(weight_versions: list[dict[str, Any]]) -> tuple[int, int] | None:
    """The lowest and highest trainer step among the versions that sampled a split's assistant turns, where they
    are step versions (`step-<n>`, engines.step_version; a turn's spans, else its `policy_version`); None when
    none is (the service's own names, or none reported)."""
    steps: list[int] = []
    for turn in weight_versions:
        spans = turn.get("weight_versions") or []
        names = [span.get("version") for span in spans] if spans else [turn.get("policy_version")]
        steps += [int(m[1]) for name in names if isinstance(name, str) and (m := _STEP_VERSION.fullmatch(name))]
    return (min(steps), max(steps)) if steps else None


def job_seconds(job: Job, since: float = 0.0) -> float:
    """The job's own duration on the service (created, or `since` (a Unix time) if later, to finished): what a
    bridge's overhead leaves out. A job found again by its key ran partly before the call that found it."""
    if job.finished_at is None or not job.created_at:
        return 0.0
    return max(0.0, float(job.finished_at) - max(float(job.created_at), since))
