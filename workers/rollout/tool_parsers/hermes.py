"""Hermes / Qwen style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number per message.

This is the format Qwen2.5/Qwen3 and Hermes chat templates teach the model (the
template lists the tools in <tools></tools> and asks for one JSON object per
<tool_call></tool_call> block).
"""

from __future__ import annotations

import re

from workers.rollout.tool_parsers.base import ParsedCall, ParseResult, ToolParser, call_from_json, register_parser

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@register_parser
class HermesParser(ToolParser):
    name = "hermes"
    call_format = (
        "To call a tool, write one block per call: "
        '<tool_call>{"name": <tool name>, "arguments": <arguments as a JSON object>}</tool_call>'
    )

    def streamable(self, text: str) -> str:
        """The text before the first call block (or before a tail that may start one), less trailing
        whitespace (parse strips the content). Nothing for a reply that starts with whitespace: the
        content is stripped, but a reply with a malformed call comes back whole, so either may follow."""
        if not text or text[0].isspace():
            return ""
        cut = text.find(OPEN)
        if cut < 0:
            cut = len(text) - next((k for k in range(len(OPEN) - 1, 0, -1) if text.endswith(OPEN[:k])), 0)
        return text[:cut].rstrip()

    def parse(self, text: str) -> ParseResult:
        calls: list[ParsedCall] = []
        content_parts: list[str] = []
        position = 0
        for match in _BLOCK.finditer(text):
            content_parts.append(text[position : match.start()])
            calls.append(call_from_json(match.group(0), match.group(1).strip(), ("arguments", "parameters")))
            position = match.end()
        rest = text[position:]
        if OPEN in rest:  # an unclosed block: cut off by max_tokens, or the model forgot to close it
            at = rest.index(OPEN)
            content_parts.append(rest[:at])
            calls.append(ParsedCall(raw=rest[at:], error=f"{OPEN} without a closing {CLOSE}"))
        else:
            content_parts.append(rest)
        return ParseResult(content="".join(content_parts).strip(), calls=calls)
