"""Token-in/token-out client for vLLM backends: `/inference/v1/generate`, else `/v1/completions` (llm_wire.py).

Every prompt goes out as token IDs and every generated token comes back as an ID with its
logprob, so nothing is re-tokenized.

Sampling is stated in full on every request (``Sampling.to_request``): vLLM otherwise fills
unset fields from the model's generation_config (repetition/presence/frequency penalties,
top_k, ...), which would change sampling behind the trainer's back.

Connection errors and 5xx are retried with exponential backoff; a 4xx raises
``BackendRequestError`` with the backend's message. A 2xx whose body is not a completion with
token IDs and logprobs that line up raises ``BadBackendResponse``; ``complete_routed`` treats
that like an unavailable backend and fails over.

``LLMClient.stream`` is the same call with ``stream: true`` on the generate route: each chunk's new
token ids (and their logprobs) go to a callback as vLLM samples them (llm_stream.py), and the
Completion it returns is the one ``complete`` would have returned.
Only the start is retried: once the backend has answered 200, a broken stream is
``BackendUnavailable`` at once (tokens may already be with the caller). A backend without the
generate route answers through /v1/completions in one piece, handed to the callback at the end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from shared.backend_pool import backend_auth
from workers.rollout.llm_completion import Completion, Sampling
from workers.rollout.llm_errors import BackendRequestError, BackendUnavailable, BadBackendResponse
from workers.rollout.llm_stream import StreamedCompletion, TokenSink
from workers.rollout.llm_wire import (
    COMPLETIONS_PATH,
    GENERATE_PATH,
    error_text,
    generate_body,
    is_router_404,
    parse_completions,
    parse_generate,
    request_body,
    streamed_generate_body,
)

log = logging.getLogger(__name__)


class _RouteMissing(Exception):
    """The server has no such route (FastAPI's own 404), as opposed to vLLM's 404 for an unknown model."""


class LLMClient:
    """A pooled HTTP client for any number of vLLM-protocol backends; safe to share across threads."""

    def __init__(
        self,
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        api_key: str | None = None,
    ) -> None:
        self._http = httpx.Client(
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            headers=backend_auth(api_key),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._no_generate_route: set[str] = set()  # backends without /inference/v1/generate
        self._routes_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any) -> LLMClient:
        return cls(
            request_timeout_s=settings.llm_request_timeout_s,
            connect_timeout_s=settings.llm_connect_timeout_s,
            max_retries=settings.llm_max_retries,
            backoff_s=settings.llm_retry_backoff_s,
            api_key=settings.backend_token,  # the node gateways' data key (gateway/), if the deployment has them
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def complete(
        self,
        url: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        model: str | None = None,
        backend_id: str = "",
    ) -> Completion:
        """Generate from a token-ID prompt on one backend; retries only what is safe to retry."""
        backend_id = backend_id or url
        base = url.rstrip("/")
        generated = self._on_generate_route(
            base,
            backend_id,
            lambda: self._post(
                base + GENERATE_PATH, generate_body(prompt_token_ids, sampling, model), parse_generate, backend_id
            ),
            " (started without --enable-scale-out?): using /v1/completions, which reports no weight versions",
        )
        if generated is not None:
            return generated
        body = request_body(prompt_token_ids, sampling, model)
        return self._post(base + COMPLETIONS_PATH, body, parse_completions, backend_id)

    def stream(
        self,
        url: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        on_tokens: TokenSink,
        model: str | None = None,
        backend_id: str = "",
    ) -> Completion:
        """``complete``, streamed: ``on_tokens`` gets each chunk's new token ids as the backend generates them."""
        backend_id = backend_id or url
        base = url.rstrip("/")
        body = streamed_generate_body(prompt_token_ids, sampling, model)
        generated = self._on_generate_route(
            base,
            backend_id,
            lambda: self._stream(base + GENERATE_PATH, body, on_tokens, model or "", backend_id),
            ": using /v1/completions, unstreamed",
        )
        if generated is not None:
            return generated
        completion = self._post(
            base + COMPLETIONS_PATH, request_body(prompt_token_ids, sampling, model), parse_completions, backend_id
        )
        if completion.token_ids:
            on_tokens(list(completion.token_ids))
        return completion

    def _on_generate_route(
        self, base: str, backend_id: str, call: Callable[[], Completion], fallback: str
    ) -> Completion | None:
        """`call` on the generate route, unless the backend is known to lack it: then, and when the call
        finds it missing (remembered for next time), None, and the caller falls back to /v1/completions."""
        if base in self._no_generate_route:
            return None
        try:
            return call()
        except _RouteMissing:
            log.warning("backend %s has no %s%s", backend_id, GENERATE_PATH, fallback)
            with self._routes_lock:
                self._no_generate_route.add(base)
            return None

    def _stream(
        self, endpoint: str, body: dict[str, Any], on_tokens: TokenSink, model: str, backend_id: str
    ) -> Completion:
        """One streamed generate call: the start retried as ``_post`` retries, the stream itself never."""
        started = time.perf_counter()

        def send(attempt: int) -> Completion | httpx.Response:
            with self._http.stream("POST", endpoint, json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    return response
                stream = StreamedCompletion(backend_id, model, on_tokens)
                try:
                    stream.read(response.iter_lines())
                except httpx.TimeoutException as exc:
                    raise BackendUnavailable(
                        f"the stream timed out: {type(exc).__name__}", backend_id, timed_out=True
                    ) from exc
                except httpx.TransportError as exc:
                    raise BackendUnavailable(f"the stream broke: {type(exc).__name__}: {exc}", backend_id) from exc
                return stream.completion(time.perf_counter() - started, attempt)

        return self._retrying(endpoint, backend_id, send)

    def _post(self, endpoint: str, body: dict[str, Any], parse: Any, backend_id: str) -> Completion:
        started = time.perf_counter()

        def send(attempt: int) -> Completion | httpx.Response:
            response = self._http.post(endpoint, json=body)
            if response.status_code >= 400:
                return response
            try:
                data = response.json()
            except ValueError as exc:
                raise BadBackendResponse(
                    f"{response.status_code} with a body that is not JSON: {response.text[:200]!r}", backend_id
                ) from exc
            return parse(data, backend_id, time.perf_counter() - started, attempt)

        return self._retrying(endpoint, backend_id, send)

    def _retrying(
        self, endpoint: str, backend_id: str, send: Callable[[int], Completion | httpx.Response]
    ) -> Completion:
        """`send` (attempt 1, 2, ...) until it gives a Completion: a connection error or a 5xx answer is
        retried with backoff, a 4xx is the request's fault, and a timeout is not retried: the generation
        may still be running there, so a duplicate is not piled on an overloaded backend."""
        last_error = ""
        for attempt in range(1, self.max_retries + 2):
            try:
                outcome = send(attempt)
            except httpx.TimeoutException as exc:
                raise BackendUnavailable(f"timed out: {type(exc).__name__}", backend_id, timed_out=True) from exc
            except httpx.TransportError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            else:
                if isinstance(outcome, Completion):
                    return outcome
                if outcome.status_code == 404 and is_router_404(outcome):
                    raise _RouteMissing(endpoint)
                if outcome.status_code < 500:
                    raise BackendRequestError(outcome.status_code, error_text(outcome), backend_id)
                last_error = f"{outcome.status_code}: {error_text(outcome)}"
            if attempt <= self.max_retries:
                delay = self.backoff_s * 2 ** (attempt - 1)
                log.warning("backend %s failed (%s); retry %d in %.2fs", backend_id, last_error, attempt, delay)
                time.sleep(delay)
        raise BackendUnavailable(f"{last_error} after {self.max_retries + 1} attempts", backend_id)
