"""One routed LLM call: acquire the trajectory's backend from the pool, call it, fail over.

This is the only place the agent loop needs to touch for generation: it keeps the pool's
contract (acquire before every call, report a failing backend, release at the end) in
one function, so every call of a trajectory hits its pinned backend and a dead backend
costs one re-pin, not the trajectory.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from shared import log_context
from shared.backend_pool import NOT_SERVING_MODEL, BackendPool, NoBackendAvailable
from workers.rollout.llm_client import (
    BackendRequestError,
    BackendUnavailable,
    BadBackendResponse,
    Completion,
    LLMClient,
    Sampling,
    TokenSink,
    WeightSpan,
)

log = logging.getLogger(__name__)


def complete_routed(
    pool: BackendPool,
    client: LLMClient,
    job_id: str,
    prompt_token_ids: list[int],
    sampling: Sampling,
    group_id: str | None = None,
    failovers: int = 2,
    model: str | None = None,
    on_tokens: TokenSink | None = None,
) -> Completion:
    """Generate one turn on the trajectory's pinned backend, failing over up to ``failovers`` times.

    A backend whose trainer declared its weight version (a trainer's own server, updated in place
    by it) has the turn labelled with that version, read before the call (docs/TRAINERS.md).

    ``model``: the trajectory's model; only backends serving it are picked (its token ids mean
    nothing to another model). The request names the pinned backend's registered model, so a
    server with several models (LoRA adapters) never answers with another one.

    A backend that fails the call is excluded for the rest of the call, whatever the cause:
    ``BackendUnavailable`` (connect errors or 5xx after the client's own retries, or a read
    timeout), ``BadBackendResponse`` (a 2xx that is not a usable completion) and a 404 for the
    model (the server was restarted with another model since it registered). Unavailable
    backends are also reported to the pool (an immediate /health probe; a failing one leaves
    the pool for everybody). A read timeout is never re-sent to the same backend: an
    overloaded vLLM still answers /health with 200, and the generation may still be running
    there. The call's budget is therefore bounded: at most ``failovers + 1`` distinct
    backends, each tried once through ``client.complete`` (so at most ``failovers + 1`` read
    timeouts of ``llm_request_timeout_s``, plus the client's connect retries and backoff).

    Raises ``NoBackendAvailable`` when the pool has no backend open to the trajectory (also
    when every backend that failed this call has left the pool: its own backend went away and
    no other is open), ``BackendRequestError`` on a 4xx (the request itself is wrong), and the
    last backend's ``BackendUnavailable`` / ``BadBackendResponse`` when failovers run out or
    no backend that has not failed this call is left while a failed one is still in the pool.

    ``on_tokens``: stream the generation (``LLMClient.stream``), each chunk's new token ids handed to it.
    A failover happens only before the first of them: a backend that fails after it is reported
    as above, and its error is raised (the caller has tokens it cannot take back).
    """
    delivered = False

    def deliver(ids: list[int]) -> None:
        nonlocal delivered
        delivered = True
        assert on_tokens is not None
        on_tokens(ids)

    failed: list[str] = []
    still_open = False  # whether a backend that failed this call is still in the pool
    last_error: BackendUnavailable | BadBackendResponse | None = None
    for _ in range(failovers + 1):
        try:
            pin = pool.acquire(job_id, group_id, exclude=failed, model=model)
        except NoBackendAvailable as exc:
            if last_error is None:
                raise
            if still_open:
                raise last_error from None
            # Every backend that failed this call has left the pool: none is open to the job, which
            # waits for one (the stage runner) rather than failing for its backend's death.
            raise NoBackendAvailable(f"{exc} (it failed this call: {last_error})") from last_error
        try:
            declared = pool.declared_version(pin.backend_id)  # read before: an update during the call is newer
            with log_context.bind(backend=pin.backend_id):  # every record of this call names its backend
                if on_tokens is None:
                    completion = client.complete(
                        pin.url, prompt_token_ids, sampling, model=pin.model or None, backend_id=pin.backend_id
                    )
                else:
                    completion = client.stream(
                        pin.url, prompt_token_ids, sampling, deliver, model=pin.model or None, backend_id=pin.backend_id
                    )
            return _labelled(completion, declared)
        except BackendUnavailable as exc:
            failed.append(pin.backend_id)
            _record_failover(pool, job_id, pin.backend_id)
            last_error = exc
            still_healthy = pool.report_failure(pin.backend_id, str(exc))
            still_open = still_open or still_healthy
            if delivered:
                raise
            log.warning("job %s: %s (healthy after probe: %s); failing over", job_id, exc, still_healthy)
        except BadBackendResponse as exc:
            failed.append(pin.backend_id)
            _record_failover(pool, job_id, pin.backend_id)
            last_error = exc
            still_open = True
            if delivered:
                raise
            log.warning("job %s: backend %s sent an unusable response (%s); failing over", job_id, pin.backend_id, exc)
        except BackendRequestError as exc:
            if exc.status != 404:
                raise
            failed.append(pin.backend_id)
            _record_failover(pool, job_id, pin.backend_id)
            last_error = BadBackendResponse(f"does not serve model {pin.model!r}: {exc.message}", pin.backend_id)
            pool.set_health(pin.backend_id, False, f"{NOT_SERVING_MODEL} {pin.model!r}")
            log.warning("job %s: %s; failing over", job_id, last_error)
    assert last_error is not None
    raise last_error


def _labelled(completion: Completion, declared: str) -> Completion:
    """A trainer-owned backend's turn carries the version its trainer declared, not vLLM's own label: a
    trainer that updates weights in place leaves vLLM's label at its start-up value (or reports none)."""
    if not declared:
        return completion
    return replace(completion, weight_versions=(WeightSpan(declared, 0, len(completion.token_ids)),))


def _record_failover(pool: BackendPool, job_id: str, backend_id: str) -> None:
    """Count the backend's failed call on the job's record (`failovers` in GET /v1/jobs/{id}): a job that ends
    done after its backend died says so, instead of looking like one that never met a fault."""
    key = pool.keys.job(job_id)
    if pool.redis.exists(key):  # never a stray hash for a job that is gone (or a call outside any job)
        pool.redis.hincrby(key, f"failovers:{backend_id}", 1)
