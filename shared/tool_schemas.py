"""The tools an agent can call, as OpenAI function-calling schemas.

The agent loop puts ``TOOL_SCHEMAS`` into the chat template's ``tools``; the
tool server validates every call against the same schemas, so what the model
is told and what the server accepts cannot drift apart.
"""

from __future__ import annotations

from typing import Any


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


_TIMEOUT = {"type": "number", "description": "Seconds before the call is interrupted (capped by the server)."}
_PATH = {"type": "string", "description": "File path, relative to the workspace or absolute inside it."}

TOOL_SCHEMAS: list[dict[str, Any]] = [
    _tool(
        "bash",
        "Run a command in a persistent bash shell. The working directory, variables and "
        "functions persist between calls. Output is stdout and stderr together, truncated "
        "when long. Do not run interactive programs: stdin is empty.",
        {"command": {"type": "string", "description": "The bash command(s) to run."}, "timeout": _TIMEOUT},
        ["command"],
    ),
    _tool(
        "python",
        "Run code in a persistent IPython kernel. Variables and imports persist between "
        "calls. Returns printed output, the value of the last expression and tracebacks.",
        {"code": {"type": "string", "description": "Python code to execute."}, "timeout": _TIMEOUT},
        ["code"],
    ),
    _tool(
        "view",
        "Show a file with line numbers, optionally only lines view_range=[start, end] "
        "(1-based, inclusive; end -1 means the last line), or list a directory.",
        {"path": _PATH, "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}},
        ["path"],
    ),
    _tool(
        "create",
        "Create a file with the given content, or overwrite an existing one.",
        {"path": _PATH, "file_text": {"type": "string", "description": "The whole content of the file."}},
        ["path", "file_text"],
    ),
    _tool(
        "str_replace",
        "Replace the one occurrence of old_str in a file with new_str. old_str must match "
        "exactly (whitespace included) and occur exactly once.",
        {
            "path": _PATH,
            "old_str": {"type": "string", "description": "Exact text to replace."},
            "new_str": {"type": "string", "description": "Replacement text (empty to delete)."},
        },
        ["path", "old_str"],
    ),
    _tool(
        "finish",
        "Call when the task is done. Give the final answer if the task asks for one.",
        {"answer": {"type": "string", "description": "The final answer, if any."}},
        [],
    ),
]

TOOL_NAMES: tuple[str, ...] = tuple(t["function"]["name"] for t in TOOL_SCHEMAS)
_BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOL_SCHEMAS}
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "array": (list, tuple),
    "boolean": (bool,),
    "object": (dict,),
}


def validate_call(tool: object, args: object) -> str | None:
    """Why a call does not fit its schema, or None when it does."""
    if not isinstance(tool, str) or tool not in _BY_NAME:
        return f"unknown tool {tool!r}; available tools: {', '.join(TOOL_NAMES)}"
    if not isinstance(args, dict):
        return f"arguments of {tool} must be an object, got {type(args).__name__}"
    schema = _BY_NAME[tool]
    missing = [name for name in schema["required"] if name not in args]
    if missing:
        return f"{tool}: missing required argument(s): {', '.join(missing)}"
    unknown = sorted(set(args) - set(schema["properties"]))
    if unknown:
        return f"{tool}: unknown argument(s): {', '.join(map(str, unknown))}"
    for name, value in args.items():
        expected = schema["properties"][name]["type"]
        if (isinstance(value, bool) and expected != "boolean") or not isinstance(value, _TYPES[expected]):
            return f"{tool}: argument {name!r} must be of type {expected}"
    return None
