"""What a tool-call parser returns, and the registry of parsers by name."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ParsedCall:
    """One tool call found in an assistant message; `error` set means malformed (not run)."""

    raw: str
    name: str | None = None
    arguments: dict[str, Any] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class ParseResult:
    content: str  # the message text outside the tool calls
    calls: list[ParsedCall] = field(default_factory=list)


class ToolParser:
    """Finds tool calls in a decoded assistant message. Never raises on model output."""

    name: str = "abstract"
    # How to call a tool, for chat templates that do not render `tools` themselves.
    call_format: str = ""

    def parse(self, text: str) -> ParseResult:
        raise NotImplementedError

    def streamable(self, text: str) -> str:
        """How much of an unfinished reply `text` surely begins the content `parse` gives for the whole
        reply (and so may be streamed before it ends). None by default: a parser that knows its call
        syntax says more."""
        return ""


_PARSERS: dict[str, Callable[[], ToolParser]] = {}


def register_parser(cls: type[ToolParser]) -> type[ToolParser]:
    _PARSERS[cls.name] = cls
    return cls


def get_parser(name: str) -> ToolParser:
    try:
        return _PARSERS[name]()
    except KeyError:
        raise KeyError(f"unknown tool parser {name!r}; known: {', '.join(sorted(_PARSERS))}") from None


def known_parsers() -> list[str]:
    return sorted(_PARSERS)


def call_from_json(raw: str, payload: str, argument_keys: tuple[str, ...]) -> ParsedCall:
    """Decode `{"name": ..., <argument key>: {...}}`; malformed input becomes a call with `error` set."""
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        return ParsedCall(raw=raw, error=f"tool call is not valid JSON: {json_error(exc)}")
    return call_from_object(raw, obj, argument_keys)


def json_error(exc: BaseException) -> str:
    """What is wrong with some JSON: json's own message, or the limit it hit (nesting depth, an
    integer literal of over 4300 digits), which json raises as RecursionError or ValueError."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at position {exc.pos}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)[:200]


def call_from_object(raw: str, obj: Any, argument_keys: tuple[str, ...]) -> ParsedCall:
    if not isinstance(obj, dict):
        return ParsedCall(raw=raw, error=f"tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ParsedCall(raw=raw, error='tool call has no "name" string')
    arguments: Any = {}
    for key in argument_keys:
        if key in obj:
            arguments = obj[key]
            break
    if isinstance(arguments, str):  # some models encode the arguments as a JSON string (OpenAI style)
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as exc:
            message = exc.msg if isinstance(exc, json.JSONDecodeError) else json_error(exc)
            return ParsedCall(raw=raw, name=name, error=f"arguments of {name} are not valid JSON: {message}")
    if not isinstance(arguments, dict):
        return ParsedCall(raw=raw, name=name, error=f"arguments of {name} must be a JSON object")
    return ParsedCall(raw=raw, name=name, arguments=arguments)
