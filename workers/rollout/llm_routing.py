"""One routed LLM call: acquire the trajectory's backend from the pool, call it, fail over.

This is the only place the agent loop needs to touch for generation: it keeps the pool's
contract (acquire before every call, report a failing backend, release at the end) in
one function, so every call of a trajectory hits its pinned backend and a dead backend
costs one re-pin, not the trajectory.
"""

from __future__ import annotations

import logging
import threading

from shared import log_context
from shared.backend_pool import BackendPool, NoBackendAvailable, Pin
from workers.rollout.llm_client import (
    BackendRequestError,
    BackendUnavailable,
    BadBackendResponse,
    Completion,
    LLMClient,
    Sampling,
)

log = logging.getLogger(__name__)

# (url, registered model) -> the one model name that backend actually serves, for backends
# registered under a name they do not serve (see _model_not_served).
_served_names: dict[tuple[str, str], str] = {}
_served_lock = threading.Lock()
# How many times one call follows a rename (a weight reload may land between /v1/models and the retry).
_RENAME_RETRIES = 2


def complete_routed(
    pool: BackendPool,
    client: LLMClient,
    job_id: str,
    prompt_token_ids: list[int],
    sampling: Sampling,
    group_id: str | None = None,
    failovers: int = 2,
) -> Completion:
    """Generate one turn on the trajectory's pinned backend, failing over up to ``failovers`` times.

    The request names the pinned backend's registered model (``model``: vLLM before 0.8
    requires it, and it keeps a server that serves several models, e.g. LoRA adapters, from
    answering with another one); the response's ``model`` is what the turn records.

    A backend that fails the call is excluded for the rest of the call, whatever the cause:
    ``BackendUnavailable`` (connect errors or 5xx after the client's own retries, or a read
    timeout) and ``BadBackendResponse`` (a 2xx that is not a usable completion). Unavailable
    backends are also reported to the pool (an immediate /health probe; a failing one leaves
    the pool for everybody). A read timeout is never re-sent to the same backend: an
    overloaded vLLM still answers /health with 200, and the generation may still be running
    there. The call's budget is therefore bounded: at most ``failovers + 1`` distinct
    backends, each tried once through ``client.complete`` (so at most ``failovers + 1`` read
    timeouts of ``llm_request_timeout_s``, plus the client's connect retries and backoff).

    Raises ``NoBackendAvailable`` when the pool has no backend open to the trajectory,
    ``BackendRequestError`` on a 4xx (the request itself is wrong), and the last backend's
    ``BackendUnavailable`` / ``BadBackendResponse`` when failovers run out or no backend
    that has not failed this call is left.
    """
    failed: list[str] = []
    last_error: BackendUnavailable | BadBackendResponse | None = None
    for _ in range(failovers + 1):
        try:
            pin = pool.acquire(job_id, group_id, exclude=failed)
        except NoBackendAvailable:
            if last_error is None:
                raise
            raise last_error from None
        try:
            with log_context.bind(backend=pin.backend_id):  # every record of this call names its backend
                return _complete_on(client, pin, prompt_token_ids, sampling)
        except BackendUnavailable as exc:
            failed.append(pin.backend_id)
            last_error = exc
            still_healthy = pool.report_failure(pin.backend_id, str(exc))
            log.warning("job %s: %s (healthy after probe: %s); failing over", job_id, exc, still_healthy)
        except BadBackendResponse as exc:
            failed.append(pin.backend_id)
            last_error = exc
            log.warning("job %s: backend %s sent an unusable response (%s); failing over", job_id,
                        pin.backend_id, exc)
    assert last_error is not None
    raise last_error


def _complete_on(client: LLMClient, pin: Pin, prompt_token_ids: list[int], sampling: Sampling) -> Completion:
    key = (pin.url, pin.model)
    model = _served_names.get(key, pin.model) or None
    for _ in range(_RENAME_RETRIES):
        try:
            return client.complete(pin.url, prompt_token_ids, sampling, model=model, backend_id=pin.backend_id)
        except BackendRequestError as exc:
            served = _model_not_served(client, pin, model, exc)
            if served is None:
                raise
            with _served_lock:
                _served_names[key] = served
            model = served
    return client.complete(pin.url, prompt_token_ids, sampling, model=model, backend_id=pin.backend_id)


def _model_not_served(client: LLMClient, pin: Pin, model: str | None, exc: BackendRequestError) -> str | None:
    """The name to use instead when a backend 404s the registered model name.

    Only when the backend serves exactly one model: then the registration merely misnames
    it (or the CPU backend's weights were reloaded under a new policy version), and that one
    model is what every request gets anyway. With several served models
    (LoRA adapters) the 404 stands: guessing could silently sample from the wrong policy.
    """
    if exc.status != 404 or not model:
        return None
    served = client.served_models(pin.url)
    if len(served) != 1 or served[0] == model:
        return None
    log.warning(
        "backend %s (%s) does not serve model %r but only %r (a misnamed registration, or its weights "
        "were reloaded under a new version): using %r", pin.backend_id, pin.url, model, served[0], served[0],
    )
    return served[0]
