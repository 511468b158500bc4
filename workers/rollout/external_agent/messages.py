"""An agent's chat messages in one canonical form, so "does this call extend the last one?" is an equality.

OpenAI clients send back the assistant message they got with extra fields (refusal, audio,
annotations: None), arguments as JSON strings, content as a string or a list of text parts;
none of that changes what the chat template renders, so none of it may break the comparison.
"""

from __future__ import annotations

import json
from typing import Any

from workers.rollout.external_agent.wire import ExternalAgentError

ROLES = ("system", "developer", "user", "assistant", "tool")


def canonical(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each message as {role, content[, name][, tool_calls][, tool_call_id]}; refuses what cannot render."""
    return [_one(message, f"messages[{i}]") for i, message in enumerate(messages)]


def _one(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ExternalAgentError(400, "a message is an object with a role and content", where)
    role = message.get("role")
    if role not in ROLES:
        raise ExternalAgentError(400, f"role must be one of {', '.join(ROLES)}", f"{where}.role")
    out: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": _text(message.get("content"), f"{where}.content"),
    }
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = [_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(message["tool_calls"])]
    if role == "tool":
        out["tool_call_id"] = message.get("tool_call_id")
    return out


def _text(content: Any, where: str) -> str:
    """A string, or the text parts of a list joined; images and audio are not for this service's models."""
    return "" if content is None else joined_text(content, where)


def joined_text(
    content: Any,
    where: str,
    types: tuple[str, ...] = ("text",),
    not_content: str = "content is a string or a list of text parts",
    not_text: str = "only text content parts are supported",
) -> str:
    """A string, or the text of a list's parts (of one of `types`) joined; anything else is refused (400), as
    each format words it (`not_content`, `not_text`)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ExternalAgentError(400, not_content, where)
    parts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in types or not isinstance(part.get("text"), str):
            raise ExternalAgentError(400, not_text, f"{where}[{i}]")
        parts.append(part["text"])
    return "".join(parts)


def chat_tool(name: str, description: str | None, parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool as the chat template takes it (OpenAI's function tool)."""
    return {"type": "function", "function": {"name": name, "description": description or "", "parameters": parameters}}


def _call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ExternalAgentError(400, "a tool call has a function with a name", where)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise ExternalAgentError(
                400, "function.arguments is a JSON object", f"{where}.function.arguments"
            ) from None
    return {"id": call.get("id"), "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def wire_tool_call(call_id: str, name: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """A tool call as OpenAI returns it: arguments as a JSON string."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments or {}, ensure_ascii=False)},
    }
