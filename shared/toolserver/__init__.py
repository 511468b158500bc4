"""The in-sandbox tool server (bash, python, files, finish) and its worker-side client."""

from shared.toolserver.client import ToolClient, ToolServerError
from shared.toolserver.result import ToolResult
from shared.toolserver.schemas import TOOL_NAMES, TOOL_SCHEMAS

__all__ = ["TOOL_NAMES", "TOOL_SCHEMAS", "ToolClient", "ToolResult", "ToolServerError"]
