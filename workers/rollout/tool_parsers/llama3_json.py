"""Llama 3.x JSON tool calls: the whole message is `{"name": ..., "parameters": {...}}`.

Llama 3.1/3.2/3.3 chat templates (with `tools=`) ask the model to answer a function
call as a bare JSON object with "name" and "parameters", optionally after the
`<|python_tag|>` token; several calls may be separated by ";". A message that does not
start with "{" (after the tag) is plain content, not a call.
"""

from __future__ import annotations

import json

from workers.rollout.tool_parsers.base import (
    ParsedCall,
    ParseResult,
    ToolParser,
    call_from_object,
    json_error,
    register_parser,
)

PYTHON_TAG = "<|python_tag|>"


@register_parser
class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    call_format = (
        "To call a tool, answer with only a JSON object "
        '{"name": <tool name>, "parameters": <arguments as a JSON object>}; separate several calls with ";".'
    )

    def streamable(self, text: str) -> str:
        """A reply that does not start with `{` or the python tag is all content (stripped); one that may be a
        call streams nothing."""
        body = text.lstrip()
        if not body or body.startswith(("{", PYTHON_TAG)) or PYTHON_TAG.startswith(body):
            return ""
        return text.strip()

    def parse(self, text: str) -> ParseResult:
        body = text.strip()
        tagged = body.startswith(PYTHON_TAG)
        if tagged:
            body = body[len(PYTHON_TAG) :].strip()
        if not body.startswith("{"):
            if tagged:
                error = f"expected a JSON tool call after {PYTHON_TAG}"
                return ParseResult(content="", calls=[ParsedCall(raw=text, error=error)])
            return ParseResult(content=text.strip())
        decoder = json.JSONDecoder()
        calls: list[ParsedCall] = []
        position = 0
        while position < len(body):
            try:
                obj, end = decoder.raw_decode(body, position)
            except (ValueError, RecursionError) as exc:
                error = f"tool call is not valid JSON: {json_error(exc)}"
                calls.append(ParsedCall(raw=body[position:], error=error))
                break
            calls.append(call_from_object(body[position:end], obj, ("parameters", "arguments")))
            position = end
            rest = body[position:].lstrip()
            if not rest:
                break
            if not rest.startswith(";"):
                calls.append(ParsedCall(raw=rest, error="unexpected text after a JSON tool call"))
                break
            position = len(body) - len(rest) + 1
            while position < len(body) and body[position].isspace():
                position += 1
        return ParseResult(content="", calls=calls)
