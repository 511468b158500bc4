"""OpenAI's Responses API (`POST /v1/responses`) on a job's endpoint, as a translation to and from chat.

A request's `instructions` and `input` items become chat messages, its function tools chat tools,
and the session's chat call (the one the chat route makes) generates and records the turn; so a
Responses agent's calls extend the same token-exact record, by the same rule. The chat answer is
turned back into output items: a `message` with its `output_text`, then one `function_call` per
tool call, whose `call_id` the agent's `function_call_output` names next time.

`previous_response_id` is honoured per job: each stored response keeps its whole conversation
(without its instructions, which OpenAI does not carry over), and a request naming it continues it.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from workers.rollout.external_agent import wire
from workers.rollout.external_agent.messages import chat_tool, joined_text

if TYPE_CHECKING:
    from workers.rollout.external_agent.streaming import Progress, StreamedCall

_KEPT_RESPONSES = 256  # previous_response_id reaches this many of the job's latest responses


class ResponsesRequest(BaseModel):
    """POST /v1/responses: the fields honoured; the rest are accepted and ignored (docs/TRAJECTORY.md)."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    max_output_tokens: int | None = Field(default=None, gt=0)
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False


class ResponseHistory:
    """The conversations of a job's stored responses, by response id (the latest few)."""

    def __init__(self, capacity: int = _KEPT_RESPONSES) -> None:
        self._kept: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._capacity = capacity

    def conversation(self, response_id: str) -> list[dict[str, Any]]:
        if response_id not in self._kept:
            raise wire.ExternalAgentError(
                400, f"Previous response with id '{response_id}' not found.", "previous_response_id"
            )
        return list(self._kept[response_id])

    def keep(self, response_id: str, conversation: list[dict[str, Any]]) -> None:
        self._kept[response_id] = conversation
        while len(self._kept) > self._capacity:
            self._kept.popitem(last=False)


def chat_request(request: ResponsesRequest, earlier: list[dict[str, Any]]) -> tuple[wire.ChatRequest, int]:
    """The chat call this request makes, and where its conversation (after the instructions) starts."""
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    messages = [*system, *earlier, *input_messages(request.input)]
    if not messages:
        raise wire.ExternalAgentError(400, "input has no items", "input")
    call = wire.ChatRequest(
        model=request.model, messages=messages, tools=chat_tools(request.tools), max_tokens=request.max_output_tokens
    )
    return call, len(system)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as chat messages: consecutive function_call items join the assistant message before them."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise wire.ExternalAgentError(
                    400, "role must be one of user, assistant, system, developer", f"{where}.role"
                )
            messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = _function_call(item, where)
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise wire.ExternalAgentError(400, "a function_call_output names its call_id", f"{where}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append({"role": "tool", "content": text, "tool_call_id": item["call_id"]})
        else:
            raise wire.ExternalAgentError(
                400,
                f"input items of type {kind!r} are not supported here; supported: message, "
                "function_call, function_call_output",
                f"{where}.type",
            )
    return messages


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str):
            raise wire.ExternalAgentError(400, f"a function_call has a string {name}", f"{where}.{name}")
    function = {"name": item["name"], "arguments": item["arguments"]}
    return {"id": item["call_id"], "type": "function", "function": function}


def _text(content: Any, where: str) -> str:
    """A string, or its text content parts joined."""
    return joined_text(
        content,
        where,
        ("input_text", "output_text", "text"),
        not_text="only text content parts (input_text, output_text) are supported",
    )


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Function tools as chat tools (`strict` is not for the chat template); other tool types are refused."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise wire.ExternalAgentError(400, "only function tools are supported", f"tools[{i}].type")
        if not isinstance(tool.get("name"), str):
            raise wire.ExternalAgentError(400, "a function tool has a name", f"tools[{i}].name")
        parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        out.append(chat_tool(tool["name"], tool.get("description"), parameters))
    return out


def response_of(chat: dict[str, Any], request: ResponsesRequest, response_id: str) -> dict[str, Any]:
    """The chat.completion as a Response object: a message item, then a function_call item per tool call."""
    choice = chat["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(
            {
                "type": "message",
                "id": f"msg_{response_id}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": message["content"], "annotations": [], "logprobs": []}],
            }
        )
    for k, call in enumerate(message.get("tool_calls") or []):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{response_id}_{k}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    cut = choice["finish_reason"] == "length"
    usage = chat["usage"]
    return {
        "id": response_id,
        "object": "response",
        "created_at": time.time(),
        "model": chat["model"],
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "instructions": request.instructions,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": request.tools or [],
        "max_output_tokens": request.max_output_tokens,
        "previous_response_id": request.previous_response_id,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": {},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def conversation_after(call: wire.ChatRequest, skip: int, chat: dict[str, Any]) -> list[dict[str, Any]]:
    """What `previous_response_id` continues: the call's messages after its instructions, then the reply."""
    return [*call.messages[skip:], chat["choices"][0]["message"]]


class _Sequence:
    """Numbers a response's events (`sequence_number`) and writes each as an SSE event."""

    def __init__(self) -> None:
        self.next = 0

    def event(self, kind: str, **fields: Any) -> str:
        event = {"type": kind, "sequence_number": self.next, **fields}
        self.next += 1
        return f"event: {kind}\ndata: {json.dumps(event)}\n\n"


def _opening(response: dict[str, Any]) -> dict[str, Any]:
    return {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}


def events(response: dict[str, Any]) -> list[str]:
    """The Responses SSE sequence for a complete response: created, in_progress, each output item (added, its
    part or arguments, its deltas, done), then completed (or incomplete)."""
    sequence = _Sequence()
    opening = _opening(response)
    return [
        sequence.event("response.created", response=opening),
        sequence.event("response.in_progress", response=opening),
        *_items(sequence, response, None),
    ]


def _message_added(sequence: _Sequence, item_id: str) -> list[str]:
    """A message item (output 0) and its text part opened, before any of its text."""
    item = {"type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}
    empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return [
        sequence.event("response.output_item.added", output_index=0, item=item),
        sequence.event("response.content_part.added", item_id=item_id, output_index=0, content_index=0, part=empty),
    ]


def _items(sequence: _Sequence, response: dict[str, Any], sent: str | None) -> list[str]:
    """Each output item's events, then completed (or incomplete); `sent`: the text the message item, opened
    while streaming, has had so far (None: nothing was opened)."""
    out: list[str] = []
    for index, item in enumerate(response["output"]):
        at = {"item_id": item["id"], "output_index": index}  # where each event of this item points
        if item["type"] == "message":
            text, part_at = item["content"][0]["text"], {**at, "content_index": 0}
            if sent is None:
                out += _message_added(sequence, item["id"])
            delta = text if sent is None else wire.rest_of(text, sent)
            if delta or sent is None:
                out.append(sequence.event("response.output_text.delta", **part_at, delta=delta, logprobs=[]))
            out.append(sequence.event("response.output_text.done", **part_at, text=text, logprobs=[]))
            out.append(sequence.event("response.content_part.done", **part_at, part=item["content"][0]))
        else:
            added = {**item, "status": "in_progress", "arguments": ""}
            out.append(sequence.event("response.output_item.added", output_index=index, item=added))
            out.append(sequence.event("response.function_call_arguments.delta", **at, delta=item["arguments"]))
            out.append(
                sequence.event(
                    "response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"]
                )
            )
        out.append(sequence.event("response.output_item.done", output_index=index, item=item))
    done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    out.append(sequence.event(done, response=response))
    return out


async def stream_events(
    call: StreamedCall,
    opened: Progress,
    request: ResponsesRequest,
    response_id: str,
    model: str,
    respond: Callable[[dict[str, Any]], dict[str, Any]],
) -> AsyncIterator[str]:
    """A streamed call's events: created and in_progress at its first tokens, the message item opened at its first
    text and an `output_text.delta` per piece, then the rest (`_items`) from `respond(chat answer)`. A failure
    after the first event ends it with `error` and `response.failed`."""
    sequence = _Sequence()
    stub = {
        "id": opened.call_id,
        "model": model,
        "choices": [{"message": {"content": None}, "finish_reason": "stop"}],
        "usage": wire.usage(opened.prompt_tokens, 0),
    }
    opening = _opening(response_of(stub, request, response_id))
    yield sequence.event("response.created", response=opening)
    yield sequence.event("response.in_progress", response=opening)
    item_id, sent = f"msg_{response_id}", None
    try:
        async for text in call.texts():
            if sent is None:
                for line in _message_added(sequence, item_id):
                    yield line
                sent = ""
            sent += text
            yield sequence.event(
                "response.output_text.delta", item_id=item_id, output_index=0, content_index=0, delta=text, logprobs=[]
            )
    except wire.ExternalAgentError as exc:
        yield sequence.event("error", code=exc.kind, message=exc.message, param=exc.param)
        failed = {**opening, "status": "failed", "error": {"code": "server_error", "message": exc.message}}
        yield sequence.event("response.failed", response=failed)
        return
    assert call.result is not None
    for line in _items(sequence, {**respond(call.result), "created_at": opening["created_at"]}, sent):
        yield line
