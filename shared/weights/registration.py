"""A backend joining the pool: checked to serve its model, and caught up if it is behind the model's weights.

A server that reports a weight version other than the model's current one (a vLLM restarted on the base
weights after updates) is registered unhealthy (`stale weights`), and the current weights are loaded
into it afterwards (`catch_up_in_background`); it rejoins the pool once they are in. A backend labelled
`owner: trainer` (a trainer's own server, docs/TRAINERS.md) is never compared or loaded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from redis.exceptions import LockError, RedisError

from shared.backend_pool import Backend, BackendPool, check_serves_model
from shared.weights.update import catch_up
from shared.weights.versions import TRAINER_OWNER, WeightVersions, stale_reason

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registered:
    backend: Backend
    behind: bool  # registered out of selection until `catch_up_in_background` loads the current weights


def register_backend(
    pool: BackendPool,
    url: str,
    model: str,
    capacity: float,
    labels: dict[str, str],
    backend_id: str | None = None,
    tokenizer: str | None = None,
) -> Registered:
    """Register (or refresh) a backend; NotAModelServer unless `url` is an OpenAI-compatible server of `model`.
    Its tokenizer defaults to the model's local path the server reports."""
    timeout, key = pool.settings.llm_probe_timeout_s, pool.settings.backend_token
    root = check_serves_model(url, model, timeout, key)
    stale = (
        ""
        if labels.get("owner") == TRAINER_OWNER  # its trainer loads its weights: the service never does
        else stale_reason(WeightVersions(pool.redis, pool.keys), model, url, timeout, key)
    )
    backend = pool.register(
        url, model, capacity, labels, backend_id, tokenizer=tokenizer or root, unhealthy_reason=stale
    )
    return Registered(backend, behind=bool(stale))


def catch_up_in_background(pool: BackendPool, backend_id: str) -> None:
    """Load the model's current weights into a backend registered behind them; run after the answer, as a
    registration must not wait minutes for a reload. A failure leaves it stale: its next registration retries."""
    try:
        outcome = catch_up(pool, backend_id)
    except (RedisError, LockError) as exc:
        log.warning("backend %s: its current weights were not loaded: %s: %s", backend_id, type(exc).__name__, exc)
        return
    if outcome is not None:
        log.info("backend %s registered behind the current weights: %s %s", backend_id, outcome.status, outcome.error)
