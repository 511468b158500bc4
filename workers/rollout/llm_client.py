"""Token-in/token-out client for vLLM's OpenAI-compatible `/v1/completions`.

The prompt goes out as a list of token IDs (vLLM's CompletionRequest.prompt accepts
``list[int]``), so nothing is re-tokenized. The generated token IDs come back two ways,
and this client asks for both so it works across vLLM versions:

- ``return_token_ids: true`` (vLLM >= 0.10.2): the choice carries ``token_ids`` (generated)
  and ``prompt_token_ids`` (vllm/entrypoints/openai/completion/protocol.py,
  CompletionRequest.return_token_ids and CompletionResponseChoice.token_ids).
- ``logprobs: 0`` with ``return_tokens_as_token_ids: true``: each entry of
  ``choices[0].logprobs.tokens`` is spelled ``"token_id:{id}"`` and
  ``logprobs.token_logprobs`` holds the sampled token's logprob (CompletionRequest
  .return_tokens_as_token_ids; CompletionLogProbs). This is also where the per-token
  logprobs come from in every version.

Sampling fields pass through under vLLM's names (temperature, top_p, top_k, min_p,
max_tokens, stop, stop_token_ids, seed, ...). Connection errors and 5xx are retried with
exponential backoff; a 4xx raises ``BackendRequestError`` with the backend's message. A 2xx
whose body is not a completion with token IDs and logprobs that line up (not JSON, a missing
field, a non-string in ``logprobs.tokens``, ``token_ids`` that disagree with the
``"token_id:N"`` strings) raises ``BadBackendResponse``; ``complete_routed`` treats that like
an unavailable backend and fails over (a backend answering garbage is as good as dead for
that call).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

log = logging.getLogger(__name__)

_TOKEN_ID_PREFIX = "token_id:"


class LLMError(RuntimeError):
    """Base of every error this client raises."""


class BackendRequestError(LLMError):
    """The backend rejected the request (4xx): retrying the same request cannot help."""

    def __init__(self, status: int, message: str, backend_id: str) -> None:
        super().__init__(f"backend {backend_id} answered {status}: {message}")
        self.status = status
        self.message = message
        self.backend_id = backend_id


class BackendUnavailable(LLMError):
    """The backend could not be reached or kept failing (connect errors, 5xx, timeouts).

    The caller should report the backend to the pool and re-acquire: with the full token
    prefix sent each turn, the trajectory goes on losslessly on another backend.
    """

    def __init__(self, message: str, backend_id: str, timed_out: bool = False) -> None:
        super().__init__(f"backend {backend_id} unavailable: {message}")
        self.backend_id = backend_id
        self.timed_out = timed_out  # a read timeout: the generation may still be running there


class BadBackendResponse(LLMError):
    """The response does not carry token IDs and logprobs that line up (or is not JSON at all)."""

    def __init__(self, message: str, backend_id: str = "") -> None:
        super().__init__(f"backend {backend_id} answered badly: {message}" if backend_id else message)
        self.backend_id = backend_id


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters under vLLM's request field names; ``extra`` passes other vLLM fields through."""

    max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_request(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "ignore_eos": self.ignore_eos,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        if self.stop_token_ids:
            body["stop_token_ids"] = list(self.stop_token_ids)
        body.update(self.extra)
        return body


@dataclass(frozen=True)
class Completion:
    """One turn's generation, exactly as the backend produced it."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None
    stop_reason: int | str | None
    model: str  # the model name the backend reported: the policy version of this turn
    backend_id: str
    prompt_tokens: int
    cached_tokens: int | None
    latency_s: float
    attempts: int


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
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            headers=headers,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self.max_retries = max_retries
        self.backoff_s = backoff_s

    @classmethod
    def from_settings(cls, settings: Any, api_key: str | None = None) -> LLMClient:
        return cls(
            request_timeout_s=settings.llm_request_timeout_s,
            connect_timeout_s=settings.llm_connect_timeout_s,
            max_retries=settings.llm_max_retries,
            backoff_s=settings.llm_retry_backoff_s,
            api_key=api_key,
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
        body = request_body(prompt_token_ids, sampling, model)
        endpoint = url.rstrip("/") + "/v1/completions"
        backend_id = backend_id or url
        started = time.perf_counter()
        last_error = ""
        for attempt in range(1, self.max_retries + 2):
            try:
                response = self._http.post(endpoint, json=body)
            except httpx.TimeoutException as exc:
                # A read timeout means the generation may still be running there: do not
                # pile a duplicate on an overloaded backend; let the caller decide.
                raise BackendUnavailable(f"timed out: {type(exc).__name__}", backend_id, timed_out=True) from exc
            except httpx.TransportError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 400:
                    try:
                        data = response.json()
                    except ValueError as exc:
                        raise BadBackendResponse(
                            f"{response.status_code} with a body that is not JSON: {response.text[:200]!r}", backend_id
                        ) from exc
                    return _parse(data, backend_id, time.perf_counter() - started, attempt)
                if response.status_code < 500:
                    raise BackendRequestError(response.status_code, _error_text(response), backend_id)
                last_error = f"{response.status_code}: {_error_text(response)}"
            if attempt <= self.max_retries:
                delay = self.backoff_s * 2 ** (attempt - 1)
                log.warning("backend %s failed (%s); retry %d in %.2fs", backend_id, last_error, attempt, delay)
                time.sleep(delay)
        raise BackendUnavailable(f"{last_error} after {self.max_retries + 1} attempts", backend_id)

    def served_models(self, url: str) -> list[str]:
        """The model names a backend serves (GET /v1/models); empty when it cannot say."""
        try:
            response = self._http.get(url.rstrip("/") + "/v1/models")
            data = response.json() if response.status_code == 200 else {}
            return [str(card["id"]) for card in data.get("data", []) if isinstance(card, dict) and "id" in card]
        except (httpx.HTTPError, ValueError, AttributeError, TypeError):
            return []


def request_body(prompt_token_ids: list[int], sampling: Sampling, model: str | None = None) -> dict[str, Any]:
    """The JSON body of one token-in/token-out /v1/completions call (vLLM field names)."""
    body = {
        **sampling.to_request(),
        "prompt": list(prompt_token_ids),
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "n": 1,
        "stream": False,
    }
    if model:
        body["model"] = model
    return body


def _error_text(response: httpx.Response) -> str:
    """vLLM's ErrorResponse message (new nested or old flat shape), else the raw body."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:2000]
    if isinstance(data, dict):
        inner = data.get("error") if isinstance(data.get("error"), dict) else data
        for key in ("message", "detail"):
            if key in inner:
                return str(inner[key])
    return response.text[:2000]


def _token_ids_from_strings(tokens: Any) -> list[int] | None:
    """IDs from ``"token_id:N"`` strings (return_tokens_as_token_ids); None unless every entry is one."""
    if not isinstance(tokens, list):
        return None
    ids = []
    for token in tokens:
        if not isinstance(token, str) or not token.startswith(_TOKEN_ID_PREFIX):
            return None
        ids.append(int(token[len(_TOKEN_ID_PREFIX):]))
    return ids


def _parse(data: dict[str, Any], backend_id: str, latency_s: float, attempts: int) -> Completion:
    try:
        choice = data["choices"][0]
        logprobs = choice.get("logprobs") or {}
        token_logprobs = logprobs.get("token_logprobs")
        token_ids = choice.get("token_ids")
        from_strings = _token_ids_from_strings(logprobs.get("tokens") or [])
        if token_ids is None:  # older vLLM: recover ids from "token_id:N" strings
            if from_strings is None:
                raise BadBackendResponse(
                    "logprobs.tokens are not token_id:N strings (return_tokens_as_token_ids)", backend_id
                )
            token_ids = from_strings
        elif from_strings is not None and from_strings != [int(t) for t in token_ids]:
            raise BadBackendResponse("token_ids disagree with the token_id:N strings of logprobs.tokens", backend_id)
        if token_logprobs is None or len(token_logprobs) != len(token_ids):
            raise BadBackendResponse(
                f"{len(token_ids)} token ids but {0 if token_logprobs is None else len(token_logprobs)} logprobs",
                backend_id,
            )
        if any(v is None for v in token_logprobs):
            raise BadBackendResponse("a generated token has no logprob", backend_id)
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return Completion(
            token_ids=[int(t) for t in token_ids],
            logprobs=[float(v) for v in token_logprobs],
            text=choice.get("text", ""),
            finish_reason=choice.get("finish_reason"),
            stop_reason=choice.get("stop_reason"),
            model=data.get("model", ""),
            backend_id=backend_id,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=details.get("cached_tokens"),
            latency_s=latency_s,
            attempts=attempts,
        )
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise BadBackendResponse(f"unexpected completion response: {exc!r}", backend_id) from exc
