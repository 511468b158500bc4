"""Anthropic's Messages API (`POST /v1/messages`) on a job's endpoint, as a translation to and from chat.

`system`, the messages' text, `tool_use` and `tool_result` blocks and the tools become chat
messages and chat tools, and the session's chat call (the one the chat route makes) generates and
records the turn, so a Messages agent's calls extend the same token-exact record by the same rule.
The chat answer comes back as a Message: a text block, then a `tool_use` block per tool call, with
`stop_reason` (`end_turn`, `tool_use`, `max_tokens`, `stop_sequence`). Refusals are Anthropic's
error body; the field goes first in the message as Anthropic writes it (`messages.0.role: ...`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from shared.external_agent_errors import anthropic_error
from workers.rollout.external_agent import wire
from workers.rollout.external_agent.messages import chat_tool, joined_text

if TYPE_CHECKING:
    from workers.rollout.external_agent.streaming import Progress, StreamedCall


class MessagesRequest(BaseModel):
    """POST /v1/messages: the fields honoured; the rest are accepted and ignored (docs/TRAJECTORY.md)."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(gt=0)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False


def error_body(error: wire.ExternalAgentError) -> dict[str, Any]:
    """Anthropic's error body for a refused call."""
    return anthropic_error(error.message, error.kind, error.param)


def chat_request(request: MessagesRequest) -> wire.ChatRequest:
    """The chat call this request makes."""
    system = _text(request.system, "system") if request.system is not None else ""
    messages = [{"role": "system", "content": system}] if system else []
    for i, message in enumerate(request.messages):
        messages.extend(_messages_of(message, f"messages[{i}]"))
    return wire.ChatRequest(
        model=request.model,
        messages=messages,
        tools=chat_tools(request.tools),
        max_tokens=request.max_tokens,
        stop=request.stop_sequences,
    )


def _messages_of(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool_result blocks become tool messages, in their order.
    A system message among the messages (Claude Code sends its environment so) stays a system message there."""
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise wire.ExternalAgentError(400, "role must be one of user, assistant, system", f"{where}.role")
    content = message.get("content")
    if role == "system":
        return [{"role": "system", "content": _text(content, f"{where}.content")}]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise wire.ExternalAgentError(400, "content is a string or a list of content blocks", f"{where}.content")
    if role == "assistant":
        return [_assistant(content, f"{where}.content")]
    out: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            if out and out[-1]["role"] == "user":
                out[-1]["content"] += block["text"]
            else:
                out.append({"role": "user", "content": block["text"]})
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise wire.ExternalAgentError(400, "a tool_result names its tool_use_id", f"{at}.tool_use_id")
            result = block.get("content", "")
            text = _text(result, f"{at}.content")
            out.append({"role": "tool", "content": text, "tool_call_id": block["tool_use_id"]})
        else:
            raise wire.ExternalAgentError(400, "a user message's blocks are text and tool_result", f"{at}.type")
    return out


def _assistant(content: list[Any], where: str) -> dict[str, Any]:
    text, calls = "", []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text += block["text"]
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise wire.ExternalAgentError(400, "a tool_use block has an id and a name", at)
            if not isinstance(block.get("input"), dict):
                raise wire.ExternalAgentError(400, "a tool_use block's input is an object", f"{at}.input")
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": block["name"], "arguments": block["input"]},
                }
            )
        else:
            raise wire.ExternalAgentError(400, "an assistant message's blocks are text and tool_use", f"{at}.type")
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def _text(content: Any, where: str) -> str:
    """A string, or its text blocks joined."""
    return joined_text(
        content, where, ("text",), "a string or a list of text blocks", "only text blocks are supported here"
    )


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Client tools as chat tools; Anthropic's server tools (web search, bash, ...) are refused."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") not in (None, "custom") or not isinstance(tool.get("name"), str):
            raise wire.ExternalAgentError(
                400, "only client tools (name, description, input_schema) are supported", f"tools[{i}]"
            )
        if not isinstance(tool.get("input_schema"), dict):
            raise wire.ExternalAgentError(400, "a tool has an input_schema object", f"tools[{i}].input_schema")
        out.append(chat_tool(tool["name"], tool.get("description"), tool["input_schema"]))
    return out


def message_of(chat: dict[str, Any], request: MessagesRequest) -> dict[str, Any]:
    """The chat.completion as an Anthropic Message."""
    choice = chat["choices"][0]
    reply = choice["message"]
    content: list[dict[str, Any]] = []
    if reply.get("content"):
        content.append({"type": "text", "text": reply["content"]})
    for call in reply.get("tool_calls") or []:
        content.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["function"]["name"],
                "input": json.loads(call["function"]["arguments"]),
            }
        )
    stop_reason, stop_sequence = _stop(choice, request)
    return {
        "id": _message_id(chat["id"]),
        "type": "message",
        "role": "assistant",
        "model": chat["model"],
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": chat["usage"]["prompt_tokens"], "output_tokens": chat["usage"]["completion_tokens"]},
    }


def _message_id(chat_id: str) -> str:
    return f"msg_{chat_id.removeprefix('chatcmpl-')}"


def _stop(choice: dict[str, Any], request: MessagesRequest) -> tuple[str, str | None]:
    if choice["finish_reason"] == "tool_calls":
        return "tool_use", None
    if choice["finish_reason"] == "length":
        return "max_tokens", None
    matched = choice.get("stop_reason")
    if isinstance(matched, str) and matched in (request.stop_sequences or []):
        return "stop_sequence", matched
    return "end_turn", None


def _event(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def _opening(message: dict[str, Any]) -> str:
    usage = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0}
    opening = {**message, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
    return _event({"type": "message_start", "message": opening})


def events(message: dict[str, Any]) -> list[str]:
    """The Messages SSE sequence for a complete message: message_start, each block (start, delta, stop),
    message_delta (stop_reason, output tokens), message_stop."""
    return [_opening(message), *_blocks(message, None)]


def _blocks(message: dict[str, Any], sent: str | None) -> list[str]:
    """Each block's events, then message_delta and message_stop; `sent`: the text the text block, opened while
    streaming, has had so far (None: nothing was opened)."""
    out: list[str] = []
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            start, text = (
                {"type": "text", "text": ""},
                block["text"] if sent is None else wire.rest_of(block["text"], sent),
            )
            delta = {"type": "text_delta", "text": text} if text or sent is None else None
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        if block["type"] != "text" or sent is None:
            out.append(_event({"type": "content_block_start", "index": index, "content_block": start}))
        if delta is not None:
            out.append(_event({"type": "content_block_delta", "index": index, "delta": delta}))
        out.append(_event({"type": "content_block_stop", "index": index}))
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    out.append(
        _event({"type": "message_delta", "delta": stop, "usage": {"output_tokens": message["usage"]["output_tokens"]}})
    )
    out.append(_event({"type": "message_stop"}))
    return out


async def stream_events(
    call: StreamedCall, opened: Progress, request: MessagesRequest, model: str
) -> AsyncIterator[str]:
    """A streamed call's events: message_start at its first tokens, the text block opened at its first text and a
    `text_delta` per piece, then the rest (`_blocks`); a failure after message_start ends it with an `error` event."""
    head = {
        "id": _message_id(opened.call_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": opened.prompt_tokens, "output_tokens": 0},
    }
    yield _opening(head)
    sent = None
    try:
        async for text in call.texts():
            if sent is None:
                yield _event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
                sent = ""
            sent += text
            yield _event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})
    except wire.ExternalAgentError as exc:
        yield _event(error_body(exc))
        return
    assert call.result is not None
    for line in _blocks(message_of(call.result, request), sent):
        yield line
