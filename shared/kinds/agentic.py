"""The spec half of every agentic kind: which tools the agent gets and which task fields tune its loop.

The stage half (the sandbox, the agent loop, the trajectory) is workers/kinds/agentic.py's
`AgentTask`; a kind's stage class subclasses both (`class MathKind(MathSpec, AgentTask)`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from shared.errors import Loc
from shared.tasks.base import TaskSpec, TaskValidationError
from shared.tool_schemas import TOOL_NAMES, TOOL_SCHEMAS

# What in a task's `sandbox` decides how code runs, not what it works on (files, setup).
EXECUTION_FIELDS = frozenset({"image", "limits", "network", "env", "workdir"})
DEFAULT_TOOLS: tuple[str, ...] = ("bash", "python", "view", "create", "str_replace", "finish")
# The tool-call parsers a task may name (workers/rollout/tool_parsers/ registers one per name; a test
# holds the two lists equal).
TOOL_PARSERS: tuple[str, ...] = ("hermes", "llama3_json")


class AgentSpec(TaskSpec):
    """Subclass, set `name`, `stages` and `tools`, add the kind's own checks to `validate`, decorate with @register."""

    uses_llm: ClassVar[bool] = True
    tools: ClassVar[tuple[str, ...]] = DEFAULT_TOOLS

    def validate(self, task: dict[str, Any]) -> None:
        unknown = [name for name in self.tools if name not in TOOL_NAMES]
        if unknown:  # a kind's own bug, but better said at submit time than mid-rollout
            raise TaskValidationError(f"kind {self.name!r} names unknown tools: {', '.join(unknown)}")
        parser = task.get("tool_parser")
        if parser is not None and parser not in TOOL_PARSERS:
            raise TaskValidationError(f"task.tool_parser: one of {', '.join(TOOL_PARSERS)}")
        if not isinstance(task.get("stop_on_no_tool_call", False), bool):
            raise TaskValidationError("task.stop_on_no_tool_call: true or false")
        for field in ("max_turns", "max_context_tokens"):
            value = task.get(field)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise TaskValidationError(f"task.{field}: a positive integer")

    def execution_settings(self, task: dict[str, Any]) -> list[Loc]:
        sandbox = task.get("sandbox")
        chosen: list[Loc] = []
        if isinstance(sandbox, dict):
            chosen += [("task", "sandbox", name) for name in sorted(EXECUTION_FIELDS & sandbox.keys())]
        if "python" in task:  # the interpreter the evaluator runs the tests with
            chosen.append(("task", "python"))
        return chosen

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The JSON schemas of this kind's tools, in `tools` order, as the chat template gets them."""
        by_name = {schema["function"]["name"]: schema for schema in TOOL_SCHEMAS}
        return [by_name[name] for name in self.tools]
