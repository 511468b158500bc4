"""What goes over the wire to an external agent: OpenAI's chat/completions shapes, the subset we honour.

Requests are parsed leniently (OpenAI's other fields are accepted and ignored, as vLLM does);
what the service cannot honour is refused with a `ExternalAgentError` naming the field. Sampling is the
job's (the trainer's choice, the same for every call); a request may only ask for fewer tokens
or add stop strings.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.errors import RolloutsError
from shared.external_agent_errors import openai_error

log = logging.getLogger(__name__)


class ExternalAgentError(RolloutsError):
    """A refused call: its HTTP status, and the OpenAI error body naming the field."""

    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict[str, Any]:
        return openai_error(self.status, self.message, self.kind, self.param)


class ChatRequest(BaseModel):
    """POST /v1/chat/completions."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    stream: bool = False


class CompletionRequest(BaseModel):
    """POST /v1/completions: a text prompt (or token ids) continued verbatim."""

    model_config = ConfigDict(extra="allow")

    model: str
    prompt: str | list[int]
    max_tokens: int | None = Field(default=None, gt=0)
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    stream: bool = False


def stops_of(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_response(
    call_id: str,
    model: str,
    message: dict[str, Any],
    finish_reason: str,
    counts: dict[str, int],
    stop_reason: int | str | None = None,
) -> dict[str, Any]:
    """A chat.completion object for one choice; `stop_reason` is vLLM's (the stop string or token id that ended it)."""
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason,
                "logprobs": None,
                "stop_reason": stop_reason,
            }
        ],
        "usage": counts,
    }


def chat_chunks(response: dict[str, Any], sent: str | None = None) -> list[str]:
    """The same answer as SSE `data:` lines of chat.completion.chunk objects, ending with [DONE].

    The chunks are: the role, the content, each tool call, the finish reason with usage. After a
    stream (`sent`: the content already streamed, the role chunk with it), the rest of them.
    """
    base = {
        "id": response["id"],
        "object": "chat.completion.chunk",
        "created": response["created"],
        "model": response["model"],
    }
    choice = response["choices"][0]
    message = choice["message"]
    content = message.get("content") or ""
    deltas: list[dict[str, Any]] = [] if sent is not None else [{"role": "assistant", "content": ""}]
    if sent is not None:
        content = rest_of(content, sent)
    if content:
        deltas.append({"content": content})
    for index, call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": index, **call}]})
    chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
    chunks.append(
        {
            **base,
            "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            "usage": response["usage"],
        }
    )
    return [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]


def rest_of(content: str, sent: str) -> str:
    """What is left of the final `content` after the `sent` text streamed (a prefix of it, by construction)."""
    if content.startswith(sent):
        return content[len(sent) :]
    log.warning("the streamed text is not a prefix of the reply's content; the rest is not sent")
    return ""


def text_response(call_id: str, model: str, text: str, finish_reason: str, counts: dict[str, int]) -> dict[str, Any]:
    """A text_completion object for one choice."""
    return {
        "id": call_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}],
        "usage": counts,
    }


def text_chunks(response: dict[str, Any]) -> list[str]:
    """A text completion as SSE: the text, then the finish reason with usage, then [DONE]."""
    choice = response["choices"][0]
    head = {k: response[k] for k in ("id", "object", "created", "model")}
    chunks = [
        {**head, "choices": [{"index": 0, "text": choice["text"], "finish_reason": None, "logprobs": None}]},
        {
            **head,
            "choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"], "logprobs": None}],
            "usage": response["usage"],
        },
    ]
    return [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]
