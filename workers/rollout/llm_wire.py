"""The two vLLM routes the client speaks, token ids in and out: the request bodies and the answers read.

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

A 2xx whose body is not a completion with token IDs and logprobs that line up raises
``BadBackendResponse``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from workers.rollout.llm_completion import Completion, Sampling, WeightSpan
from workers.rollout.llm_errors import BadBackendResponse

_TOKEN_ID_PREFIX = "token_id:"
GENERATE_PATH = "/inference/v1/generate"
COMPLETIONS_PATH = "/v1/completions"


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


def streamed_generate_body(prompt_token_ids: list[int], sampling: Sampling, model: str | None = None) -> dict[str, Any]:
    """The generate call's body, streamed: the usage comes in a last chunk of its own."""
    return {
        **generate_body(prompt_token_ids, sampling, model),
        "stream": True,
        "stream_options": {"include_usage": True},
    }


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


def is_router_404(response: httpx.Response) -> bool:
    """A 404 for the path itself (FastAPI's {"detail": "Not Found"}, or any non-vLLM body), not vLLM's
    ErrorResponse 404 for an unknown model, which nests its message under "error"."""
    try:
        data = response.json()
    except ValueError:
        return True
    return not (isinstance(data, dict) and isinstance(data.get("error"), dict))


def error_text(response: httpx.Response) -> str:
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


def usage_counts(usage: dict[str, Any] | None) -> tuple[int, int | None]:
    """The prompt's token count and how many of them the backend had cached, from a response's usage."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return int(usage.get("prompt_tokens", 0)), details.get("cached_tokens")


def token_ids_from_strings(tokens: Any) -> list[int] | None:
    """IDs from ``"token_id:N"`` strings (return_tokens_as_token_ids); None unless every entry is one."""
    if not isinstance(tokens, list):
        return None
    ids = []
    for token in tokens:
        if not isinstance(token, str) or not token.startswith(_TOKEN_ID_PREFIX):
            return None
        ids.append(int(token[len(_TOKEN_ID_PREFIX) :]))
    return ids


def parse_generate(data: dict[str, Any], backend_id: str, latency_s: float, attempts: int) -> Completion:
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
        answer = _Answer(data, choice, backend_id, latency_s, attempts)
        return answer.completion(token_ids, logprobs, data.get("model") or "", spans)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise BadBackendResponse(f"unexpected generate response: {exc!r}", backend_id) from exc


def parse_completions(data: dict[str, Any], backend_id: str, latency_s: float, attempts: int) -> Completion:
    """A CompletionResponse: choice 0's token ids (or its "token_id:N" strings) and their logprobs."""
    try:
        choice = data["choices"][0]
        logprobs = choice.get("logprobs") or {}
        token_logprobs = logprobs.get("token_logprobs")
        token_ids = choice.get("token_ids")
        from_strings = token_ids_from_strings(logprobs.get("tokens") or [])
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
        answer = _Answer(data, choice, backend_id, latency_s, attempts)
        return answer.completion([int(t) for t in token_ids], [float(v) for v in token_logprobs], data.get("model", ""))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise BadBackendResponse(f"unexpected completion response: {exc!r}", backend_id) from exc


@dataclass(frozen=True)
class _Answer:
    """One 2xx answer as read: its body, the choice that holds the generation, and the call's own facts."""

    data: dict[str, Any]
    choice: dict[str, Any]
    backend_id: str
    latency_s: float
    attempts: int

    def completion(
        self, token_ids: list[int], logprobs: list[float], model: str, spans: tuple[WeightSpan, ...] = ()
    ) -> Completion:
        """The Completion of the choice's tokens, its usage counted."""
        prompt_tokens, cached_tokens = usage_counts(self.data.get("usage"))
        return Completion(
            token_ids=token_ids,
            logprobs=logprobs,
            text=self.choice.get("text", ""),
            finish_reason=self.choice.get("finish_reason"),
            stop_reason=self.choice.get("stop_reason"),
            model=model,
            backend_id=self.backend_id,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            latency_s=self.latency_s,
            attempts=self.attempts,
            weight_versions=spans,
        )
