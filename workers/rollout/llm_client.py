"""Token-in/token-out client for vLLM: `/inference/v1/generate`, else `/v1/completions`.

Every prompt goes out as token IDs and every generated token comes back as an ID with its
logprob, so nothing is re-tokenized. Two vLLM endpoints do that:

- ``POST /inference/v1/generate`` (served with ``--enable-scale-out``; vLLM >= 0.32:
  vllm/entrypoints/scale_out/token_in_token_out/protocol.py). ``GenerateRequest`` takes
  ``token_ids``, ``model`` and ``sampling_params`` (vLLM's ``SamplingParams`` fields);
  ``GenerateTokensChoice`` answers ``token_ids``, ``logprobs.content[].{token_id, logprob}``,
  ``finish_reason``, ``stop_reason`` and ``weight_versions`` (``WeightVersionSpan``: the
  ``[start, end)`` output tokens sampled by weights labelled ``version``, vllm/outputs.py).
  This is the only endpoint that reports the weight version, so the client uses it wherever
  the server offers it.
- ``POST /v1/completions`` (any vLLM >= 0.10.2), used when the generate route is missing
  (404 from the router, not vLLM's own 404 for an unknown model): ``prompt`` as a list of IDs,
  ``return_token_ids`` (choice ``token_ids``), ``logprobs: 0`` with
  ``return_tokens_as_token_ids`` (``logprobs.tokens`` spelled ``"token_id:N"``,
  ``logprobs.token_logprobs``). It silently ignores ``return_weight_versions`` (measured on
  0.32), so turns served there record no weight version.

Sampling is stated in full on every request (``Sampling.to_request``): vLLM otherwise fills
unset fields from the model's generation_config (repetition/presence/frequency penalties,
top_k, ...), which would change sampling behind the trainer's back.

Connection errors and 5xx are retried with exponential backoff; a 4xx raises
``BackendRequestError`` with the backend's message. A 2xx whose body is not a completion with
token IDs and logprobs that line up raises ``BadBackendResponse``; ``complete_routed`` treats
that like an unavailable backend and fails over.

``LLMClient.stream`` is the same call with ``stream: true`` on the generate route: each chunk's new
token ids (and their logprobs) go to a callback as vLLM samples them, and the Completion it returns
is the one ``complete`` would have returned (the same ids, logprobs, finish and weight versions).
Only the start is retried: once the backend has answered 200, a broken stream is
``BackendUnavailable`` at once (tokens may already be with the caller). A backend without the
generate route answers through /v1/completions in one piece, handed to the callback at the end.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from shared.backend_pool import backend_auth
from shared.errors import RolloutsError

log = logging.getLogger(__name__)

_TOKEN_ID_PREFIX = "token_id:"
GENERATE_PATH = "/inference/v1/generate"
COMPLETIONS_PATH = "/v1/completions"

TokenSink = Callable[[list[int]], None]  # takes each chunk's new token ids, as the backend streams them


class _RouteMissing(Exception):
    """The server has no such route (FastAPI's own 404), as opposed to vLLM's 404 for an unknown model."""


class LLMError(RolloutsError, RuntimeError):
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
    """What the job means by sampling, in vLLM's ``SamplingParams`` names; every field is sent.

    The defaults are neutral (no penalties, top_k off, min_p off), not vLLM's generation_config.
    ``extra`` passes other SamplingParams fields through.
    """

    max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) disables top-k
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_request(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "n": 1,
            "max_tokens": self.max_tokens,
            "min_tokens": 0,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": max(self.top_k, 0),
            "min_p": self.min_p,
            "seed": self.seed,
            "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids),
            "ignore_eos": self.ignore_eos,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
        }
        body.update(self.extra)
        return body


@dataclass(frozen=True)
class WeightSpan:
    """Generated tokens ``[start, end)`` of a turn were sampled by the weights labelled ``version``."""

    version: str
    start: int
    end: int


@dataclass(frozen=True)
class Completion:
    """One turn's generation, exactly as the backend produced it."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None
    stop_reason: int | str | None
    model: str  # the served model name the backend reported
    backend_id: str
    prompt_tokens: int
    cached_tokens: int | None
    latency_s: float
    attempts: int
    weight_versions: tuple[WeightSpan, ...] = ()  # empty where the endpoint does not report them

    @property
    def policy_version(self) -> str | None:
        """The weight version of the turn's first token (the oldest, if an update landed mid-turn)."""
        return self.weight_versions[0].version if self.weight_versions else None

    def ends_on_stop_token(self, special_ids: Collection[int]) -> bool:
        """Did the turn end on an end-of-turn token (EOS or a stop token id) that is in token_ids?

        vLLM names a stop token id in stop_reason; EOS gives stop_reason None, so the last token
        is then checked against the tokenizer's special ids.
        """
        if self.finish_reason != "stop" or not self.token_ids:
            return False
        last = self.token_ids[-1]
        if isinstance(self.stop_reason, int):
            return last == self.stop_reason
        return self.stop_reason is None and last in special_ids


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
            api_key=settings.backend_key,  # the node gateways' data key (gateway/), if the deployment has them
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
        if base not in self._no_generate_route:
            try:
                return self._post(
                    base + GENERATE_PATH, generate_body(prompt_token_ids, sampling, model), _parse_generate, backend_id
                )
            except _RouteMissing:
                log.warning(
                    "backend %s has no %s (started without --enable-scale-out?): using /v1/completions, "
                    "which reports no weight versions",
                    backend_id,
                    GENERATE_PATH,
                )
                with self._routes_lock:
                    self._no_generate_route.add(base)
        return self._post(base + COMPLETIONS_PATH, request_body(prompt_token_ids, sampling, model), _parse, backend_id)

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
        if base not in self._no_generate_route:
            body = {
                **generate_body(prompt_token_ids, sampling, model),
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            try:
                return self._stream(base + GENERATE_PATH, body, on_tokens, model or "", backend_id)
            except _RouteMissing:
                log.warning("backend %s has no %s: using /v1/completions, unstreamed", backend_id, GENERATE_PATH)
                with self._routes_lock:
                    self._no_generate_route.add(base)
        completion = self._post(
            base + COMPLETIONS_PATH, request_body(prompt_token_ids, sampling, model), _parse, backend_id
        )
        if completion.token_ids:
            on_tokens(list(completion.token_ids))
        return completion

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
                stream = _StreamedCompletion(backend_id, model, on_tokens)
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
                if outcome.status_code == 404 and _is_router_404(outcome):
                    raise _RouteMissing(endpoint)
                if outcome.status_code < 500:
                    raise BackendRequestError(outcome.status_code, _error_text(outcome), backend_id)
                last_error = f"{outcome.status_code}: {_error_text(outcome)}"
            if attempt <= self.max_retries:
                delay = self.backoff_s * 2 ** (attempt - 1)
                log.warning("backend %s failed (%s); retry %d in %.2fs", backend_id, last_error, attempt, delay)
                time.sleep(delay)
        raise BackendUnavailable(f"{last_error} after {self.max_retries + 1} attempts", backend_id)


class _StreamedCompletion:
    """A generate stream (GenerateTokensStreamResponse chunks) read into one Completion, each chunk's ids handed on.

    Chunks carry the new ``token_ids`` with ``logprobs.content`` for them; the last choice chunk
    ``finish_reason``, ``stop_reason`` and ``weight_versions`` (the whole output); a final chunk
    without choices the usage; then ``[DONE]``. vLLM reports a failure inside the stream as a
    ``data: {"error": ...}`` line."""

    def __init__(self, backend_id: str, model: str, on_tokens: TokenSink) -> None:
        self.backend_id, self.model, self.on_tokens = backend_id, model, on_tokens
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.spans: tuple[WeightSpan, ...] = ()
        self.usage: dict[str, Any] = {}

    def read(self, lines: Iterable[str]) -> None:
        for line in lines:
            if not line.startswith("data:"):
                continue
            payload = line[len("data:") :].strip()
            if payload == "[DONE]":
                if self.finish_reason is None:
                    raise BadBackendResponse("the stream ended without a finish reason", self.backend_id)
                return
            try:
                data = json.loads(payload)
            except ValueError as exc:
                raise BadBackendResponse(f"a stream chunk is not JSON: {payload[:200]!r}", self.backend_id) from exc
            if not isinstance(data, dict):
                raise BadBackendResponse(f"a stream chunk is not an object: {payload[:200]!r}", self.backend_id)
            if data.get("error") is not None:  # the generation failed in the engine, after the 200
                error = data["error"]
                message = error.get("message") if isinstance(error, dict) else error
                raise BackendUnavailable(f"the stream ended with an error: {message}", self.backend_id)
            self.usage = data.get("usage") or self.usage
            for choice in data.get("choices") or []:
                self._take(choice)
        raise BackendUnavailable("the stream ended before [DONE]", self.backend_id)

    def _take(self, choice: dict[str, Any]) -> None:
        try:
            ids = [int(t) for t in choice.get("token_ids") or []]
            content = (choice.get("logprobs") or {}).get("content") or []
            if len(content) != len(ids) or any(int(e["token_id"]) != t for e, t in zip(content, ids)):
                raise BadBackendResponse("a stream chunk's logprobs do not line up with its token ids", self.backend_id)
            logprobs = [float(entry["logprob"]) for entry in content]
            if choice.get("weight_versions"):
                self.spans = tuple(
                    WeightSpan(str(s["version"]), int(s["start"]), int(s["end"])) for s in choice["weight_versions"]
                )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadBackendResponse(f"unexpected stream chunk: {exc!r}", self.backend_id) from exc
        if choice.get("finish_reason") is not None:
            self.finish_reason, self.stop_reason = choice["finish_reason"], choice.get("stop_reason")
        if ids:
            self.token_ids += ids
            self.logprobs += logprobs
            self.on_tokens(ids)

    def completion(self, latency_s: float, attempts: int) -> Completion:
        details = self.usage.get("prompt_tokens_details") or {}
        return Completion(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            text="",
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            model=self.model,  # the stream's chunks do not name it: the model the request named
            backend_id=self.backend_id,
            prompt_tokens=int(self.usage.get("prompt_tokens", 0)),
            cached_tokens=details.get("cached_tokens"),
            latency_s=latency_s,
            attempts=attempts,
            weight_versions=self.spans,
        )


def generate_body(prompt_token_ids: list[int], sampling: Sampling, model: str | None = None) -> dict[str, Any]:
    """The JSON body of one /inference/v1/generate call (GenerateRequest; SamplingParams names)."""
    body: dict[str, Any] = {
        "token_ids": list(prompt_token_ids),
        "sampling_params": {**sampling.to_request(), "logprobs": 0},  # 0: the sampled token's logprob only
        "output_mode": "tokens",
        "stream": False,
    }
    if model:
        body["model"] = model
    return body


def request_body(prompt_token_ids: list[int], sampling: Sampling, model: str | None = None) -> dict[str, Any]:
    """The JSON body of one token-in/token-out /v1/completions call (CompletionRequest names)."""
    body = {
        **sampling.to_request(),
        "prompt": list(prompt_token_ids),
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "stream": False,
    }
    if model:
        body["model"] = model
    return body


def _is_router_404(response: httpx.Response) -> bool:
    """A 404 for the path itself (FastAPI's {"detail": "Not Found"}, or any non-vLLM body), not vLLM's
    ErrorResponse 404 for an unknown model, which nests its message under "error"."""
    try:
        data = response.json()
    except ValueError:
        return True
    return not (isinstance(data, dict) and isinstance(data.get("error"), dict))


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
        ids.append(int(token[len(_TOKEN_ID_PREFIX) :]))
    return ids


def _parse_generate(data: dict[str, Any], backend_id: str, latency_s: float, attempts: int) -> Completion:
    """A GenerateTokensResponse: token ids, per-token logprobs and weight-version spans of choice 0."""
    try:
        choice = data["choices"][0]
        token_ids = [int(t) for t in choice["token_ids"]]
        content = (choice.get("logprobs") or {}).get("content")
        if content is None or len(content) != len(token_ids):
            raise BadBackendResponse(
                f"{len(token_ids)} token ids but {0 if content is None else len(content)} logprobs", backend_id
            )
        if any(int(entry["token_id"]) != token for entry, token in zip(content, token_ids)):
            raise BadBackendResponse("logprobs.content token ids disagree with token_ids", backend_id)
        logprobs = [float(entry["logprob"]) for entry in content]
        spans = tuple(
            WeightSpan(str(span["version"]), int(span["start"]), int(span["end"]))
            for span in choice.get("weight_versions") or []
        )
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return Completion(
            token_ids=token_ids,
            logprobs=logprobs,
            text=choice.get("text", ""),
            finish_reason=choice.get("finish_reason"),
            stop_reason=choice.get("stop_reason"),
            model=data.get("model") or "",
            backend_id=backend_id,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=details.get("cached_tokens"),
            latency_s=latency_s,
            attempts=attempts,
            weight_versions=spans,
        )
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise BadBackendResponse(f"unexpected generate response: {exc!r}", backend_id) from exc


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
