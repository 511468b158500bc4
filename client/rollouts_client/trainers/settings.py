"""What both bridges are told: where the service is and what to do with a failed job or a rewritten history."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from rollouts_client.wire import RetryPolicy

ON_FAILURE = ("retry", "raise")
ON_SEGMENTS = ("last", "raise", "all")
ENGINES = ("service", "trainer")


def _engine_urls_from_env() -> tuple[str, ...] | None:
    given = os.environ.get("ROLLOUTS_TRAINER_ENGINE_URLS", "")
    return tuple(u.strip() for u in given.split(",") if u.strip()) or None


@dataclass(frozen=True)
class BridgeSettings:
    """One bridge's settings; `from_mapping` takes them from a trainer's config (unknown names are refused).

    `on_failure`: a job that ends `failed`, `timed_out` or `cancelled` (an infrastructure or
    evaluation failure, never the model's answer) is resubmitted up to `max_attempts` times in
    all ("retry") or raised at once ("raise"); either way it never becomes a reward. A job whose own input
    cannot run (`error.type` prompt_too_long: over `limits.max_prompt_tokens`) is raised at once either way.
    `on_segments`: a record whose external agent rewrote its history holds earlier segments;
    "last" trains on the last segment (the one evaluated), "raise" refuses the record, "all" trains on every
    segment as a sequence of its own (only where the trainer takes several per row: verl's V1 worker, whose
    loop makes it the default when unset; SkyRL, TRL and verl's legacy worker refuse it).
    `engines`: "service" (the service's own backends; a trainer updates them with POST
    /v1/models/{model}/weights) or "trainer" (the trainer's own vLLM servers, updated in place by it:
    the bridge registers them in the pool, declares the trainer's step as their weight version and
    deregisters them at exit; rollouts_client/trainers/engines.py). `engine_urls`: those servers
    (unset: ROLLOUTS_TRAINER_ENGINE_URLS, comma-separated, else what the trainer says: SkyRL's
    inference client's `server_urls`, verl's server manager's addresses); `model` is then required.
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
    engines: str = field(default_factory=lambda: os.environ.get("ROLLOUTS_TRAINER_ENGINES", "service"))
    engine_urls: tuple[str, ...] | None = field(default_factory=_engine_urls_from_env)
    engine_heartbeat_s: float = 5.0

    def __post_init__(self) -> None:
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure: one of {ON_FAILURE}, not {self.on_failure!r}")
        if self.on_segments not in ON_SEGMENTS:
            raise ValueError(f"on_segments: one of {ON_SEGMENTS}, not {self.on_segments!r}")
        if self.engines not in ENGINES:
            raise ValueError(f"engines: one of {ENGINES}, not {self.engines!r}")
        if self.engine_urls is not None:  # a YAML or JSON list: kept as a tuple (settings are hashable)
            urls = [self.engine_urls] if isinstance(self.engine_urls, str) else self.engine_urls
            object.__setattr__(self, "engine_urls", tuple(str(u) for u in urls))
        if self.engines == "trainer" and not self.model:
            raise ValueError("model: required with engines: trainer (the name the trainer's servers serve)")
        if self.engine_heartbeat_s <= 0:
            raise ValueError("engine_heartbeat_s: positive")
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
