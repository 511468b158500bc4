"""The in-sandbox tool server (bash, python, files, finish) and its worker-side client."""

from shared.tool_schemas import TOOL_NAMES, TOOL_SCHEMAS
from workers.toolserver.client import ToolClient, ToolServerError
from workers.toolserver.result import ToolResult

__all__ = ["TOOL_NAMES", "TOOL_SCHEMAS", "ToolClient", "ToolResult", "ToolServerError"]
