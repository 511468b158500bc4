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
from shared.backend_pool import NOT_SERVING_MODEL, BackendPool, NoBackendAvailable, Pin
from workers.rollout.llm_client import LLMClient
from workers.rollout.llm_completion import Completion, Sampling, WeightSpan
from workers.rollout.llm_errors import BackendRequestError, BackendUnavailable, BadBackendResponse
from workers.rollout.llm_stream import TokenSink

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
    failover = _Failover(pool, job_id, group_id, model)
    stream = _Delivery(on_tokens)
    for _ in range(failovers + 1):
        pin = failover.acquire()
        try:
            declared = pool.declared_version(pin.backend_id)  # read before: an update during the call is newer
            with log_context.bind(backend=pin.backend_id):  # every record of this call names its backend
                completion = stream.generate(client, pin, prompt_token_ids, sampling)
            return _labelled(completion, declared)
        except BackendUnavailable as exc:
            still_healthy = failover.unavailable(pin.backend_id, exc)
            if stream.delivered:
                raise
            log.warning("job %s: %s (healthy after probe: %s); failing over", job_id, exc, still_healthy)
        except BadBackendResponse as exc:
            failover.unusable(pin.backend_id, exc)
            if stream.delivered:
                raise
            log.warning("job %s: backend %s sent an unusable response (%s); failing over", job_id, pin.backend_id, exc)
        except BackendRequestError as exc:
            if exc.status != 404:
                raise
            failover.not_serving(pin, exc)
            log.warning("job %s: %s; failing over", job_id, failover.last_error)
    assert failover.last_error is not None
    raise failover.last_error


class _Delivery:
    """How a turn is generated: in one piece, or streamed to `on_tokens`, noting whether any token went out
    (after that, a failover would hand the caller tokens it cannot take back)."""

    def __init__(self, on_tokens: TokenSink | None) -> None:
        self.on_tokens = on_tokens
        self.delivered = False

    def generate(self, client: LLMClient, pin: Pin, prompt_token_ids: list[int], sampling: Sampling) -> Completion:
        model = pin.model or None
        if self.on_tokens is None:
            return client.complete(pin.url, prompt_token_ids, sampling, model=model, backend_id=pin.backend_id)
        return client.stream(pin.url, prompt_token_ids, sampling, self._deliver, model=model, backend_id=pin.backend_id)

    def _deliver(self, ids: list[int]) -> None:
        self.delivered = True
        assert self.on_tokens is not None
        self.on_tokens(ids)


class _Failover:
    """What one routed call has met so far: the backends that failed it (excluded for the rest of the call),
    whether one of them is still in the pool, and the last error."""

    def __init__(self, pool: BackendPool, job_id: str, group_id: str | None, model: str | None) -> None:
        self.pool, self.job_id, self.group_id, self.model = pool, job_id, group_id, model
        self.failed: list[str] = []
        self.still_open = False  # whether a backend that failed this call is still in the pool
        self.last_error: BackendUnavailable | BadBackendResponse | None = None

    def acquire(self) -> Pin:
        """The next backend to try; when none is open, the error that says best why."""
        try:
            return self.pool.acquire(self.job_id, self.group_id, exclude=self.failed, model=self.model)
        except NoBackendAvailable as exc:
            if self.last_error is None:
                raise
            if self.still_open:
                raise self.last_error from None
            # Every backend that failed this call has left the pool: none is open to the job, which
            # waits for one (the stage runner) rather than failing for its backend's death.
            raise NoBackendAvailable(f"{exc} (it failed this call: {self.last_error})") from self.last_error

    def unavailable(self, backend_id: str, error: BackendUnavailable) -> bool:
        """Unreachable or failing: reported to the pool (a /health probe); whether it is still healthy."""
        self._failed(backend_id, error)
        still_healthy = self.pool.report_failure(backend_id, str(error))
        self.still_open = self.still_open or still_healthy
        return still_healthy

    def unusable(self, backend_id: str, error: BadBackendResponse) -> None:
        """A 2xx that is not a usable completion: the backend stays in the pool."""
        self._failed(backend_id, error)
        self.still_open = True

    def not_serving(self, pin: Pin, error: BackendRequestError) -> None:
        """A 404 for the model: the server was restarted with another model since it registered."""
        self._failed(
            pin.backend_id, BadBackendResponse(f"does not serve model {pin.model!r}: {error.message}", pin.backend_id)
        )
        self.pool.set_health(pin.backend_id, False, f"{NOT_SERVING_MODEL} {pin.model!r}")

    def _failed(self, backend_id: str, error: BackendUnavailable | BadBackendResponse) -> None:
        self.failed.append(backend_id)
        _record_failover(self.pool, self.job_id, backend_id)
        self.last_error = error


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
