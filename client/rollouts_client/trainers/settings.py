"""What both bridges are told: where the service is and what to do with a failed job or a rewritten history."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from rollouts_client.wire import RetryPolicy

ON_FAILURE = ("retry", "raise")
ON_SEGMENTS = ("last", "raise")


@dataclass(frozen=True)
class BridgeSettings:
    """One bridge's settings; `from_mapping` takes them from a trainer's config (unknown names are refused).

    `on_failure`: a job that ends `failed`, `timed_out` or `cancelled` (an infrastructure or
    evaluation failure, never the model's answer) is resubmitted up to `max_attempts` times in
    all ("retry") or raised at once ("raise"); either way it never becomes a reward.
    `on_segments`: a record whose external agent rewrote its history holds earlier segments;
    "last" trains on the last segment (the one evaluated), "raise" refuses the record.
    `run_id` (unset: ROLLOUTS_RUN_ID, else "default") names the run in the jobs' idempotency keys: a restarted trainer with the same run id
    finds its jobs instead of submitting them again.
    """

    api_url: str | None = None  # unset: ROLLOUTS_API_URL
    token: str | None = None  # unset: ROLLOUTS_API_TOKEN
    model: str | None = None  # the served model the jobs sample from; unset: any backend's
    run_id: str = field(default_factory=lambda: os.environ.get("ROLLOUTS_RUN_ID", "default"))
    on_failure: str = "retry"
    max_attempts: int = 3
    on_segments: str = "last"
    max_tokens_per_turn: int | None = None  # unset: the trainer's own (verl: rollout.response_length)
    wait_timeout_s: float | None = None  # per job; unset: the job's own time limits end it
    poll_min_s: float = 0.05
    poll_max_s: float = 0.1
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # transport errors and 503s, with backoff

    def __post_init__(self) -> None:
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure: one of {ON_FAILURE}, not {self.on_failure!r}")
        if self.on_segments not in ON_SEGMENTS:
            raise ValueError(f"on_segments: one of {ON_SEGMENTS}, not {self.on_segments!r}")
        if self.max_attempts < 1:
            raise ValueError("max_attempts: at least 1")
        if not 0 < self.poll_min_s <= self.poll_max_s:
            raise ValueError("poll_min_s and poll_max_s: 0 < poll_min_s <= poll_max_s")

    @classmethod
    def from_mapping(cls, values: dict[str, Any] | None) -> BridgeSettings:
        values = dict(values or {})
        known = {f.name for f in fields(cls)} - {"retry"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown rollouts bridge settings: {unknown}; known: {sorted(known)}")
        return cls(**values)
