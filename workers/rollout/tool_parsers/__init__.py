"""Pluggable tool-call parsers: `get_parser(settings.agent_tool_parser)`.

Shipped: `hermes` (Qwen/Hermes `<tool_call>` blocks) and `llama3_json` (Llama 3.x bare
JSON calls). A new format is a ToolParser subclass decorated with @register_parser.
"""

from workers.rollout.tool_parsers import hermes, llama3_json  # noqa: F401  (register the built-ins)
from workers.rollout.tool_parsers.base import (
    ParsedCall,
    ParseResult,
    ToolParser,
    get_parser,
    known_parsers,
    register_parser,
)

__all__ = ["ParseResult", "ParsedCall", "ToolParser", "get_parser", "known_parsers", "register_parser"]
