"""One routed LLM call: acquire the trajectory's backend from the pool, call it, fail over.

This is the only place the agent loop needs to touch for generation: it keeps the pool's
contract (acquire before every call, report a failing backend, release at the end) in
one function, so every call of a trajectory hits its pinned backend and a dead backend
costs one re-pin, not the trajectory.
"""

from __future__ import annotations

import logging

from shared.backend_pool import BackendPool
from workers.rollout.llm_client import BackendUnavailable, Completion, LLMClient, Sampling

log = logging.getLogger(__name__)


def complete_routed(
    pool: BackendPool,
    client: LLMClient,
    job_id: str,
    prompt_token_ids: list[int],
    sampling: Sampling,
    group_id: str | None = None,
    failovers: int = 2,
) -> Completion:
    """Generate one turn on the trajectory's pinned backend, re-pinning up to ``failovers`` times.

    Raises ``NoBackendAvailable`` when the pool is empty, ``BackendRequestError`` on a 4xx
    (the request itself is wrong), ``BackendUnavailable`` when failovers run out.
    """
    for attempt in range(failovers + 1):
        pin = pool.acquire(job_id, group_id)
        try:
            return client.complete(pin.url, prompt_token_ids, sampling, model=None, backend_id=pin.backend_id)
        except BackendUnavailable as exc:
            still_healthy = pool.report_failure(pin.backend_id, str(exc))
            log.warning("job %s: %s (healthy after probe: %s)", job_id, exc, still_healthy)
            if attempt == failovers:
                raise
    raise AssertionError("unreachable")
