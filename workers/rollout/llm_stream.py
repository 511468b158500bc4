"""A streamed generate call read into one Completion, each chunk's new token ids handed on as they come.

The Completion is the one an unstreamed call would have returned (the same ids, logprobs, finish and
weight versions); the client (llm_client.py) decides what a broken stream means.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from workers.rollout.llm_completion import Completion, WeightSpan
from workers.rollout.llm_errors import BackendUnavailable, BadBackendResponse
from workers.rollout.llm_wire import usage_counts

TokenSink = Callable[[list[int]], None]  # takes each chunk's new token ids, as the backend streams them


class StreamedCompletion:
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
        prompt_tokens, cached_tokens = usage_counts(self.usage)
        return Completion(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            text="",
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            model=self.model,  # the stream's chunks do not name it: the model the request named
            backend_id=self.backend_id,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            latency_s=latency_s,
            attempts=attempts,
            weight_versions=self.spans,
        )
