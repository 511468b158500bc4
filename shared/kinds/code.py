"""The `code` kind's spec: the agent writes a solution file; hidden tests judge it in a fresh sandbox.

Task fields: `prompt` (the problem), `tests` (stdin/stdout cases and/or assert
snippets) and/or `test_code` (a pytest-style module), `entry_file` (default
solution.py), `starter_code`, `files` (more init files), `scoring` ("fraction"
or "all"), `timeout_s` per test, `memory_mb` per test process, `setup_code` (run at
the top of the solution's module before it). MBPP and HumanEval rows are read as they
are with `format` (shared/kinds/formats.py `code_fields`). Its stages: workers/kinds/code.py.
"""

from __future__ import annotations

from typing import Any, ClassVar

from shared.kinds.agentic import AgentSpec
from shared.kinds.code_tests import parse_tests
from shared.kinds.formats import code_fields, task_format
from shared.kinds.task_fields import optional_number, relative_path, require_str
from shared.tasks.base import TaskValidationError
from shared.tasks.registry import register


@register
class CodeSpec(AgentSpec):
    name = "code"
    stages = "workers.kinds.code:CodeKind"
    tools: ClassVar[tuple[str, ...]] = ("bash", "python", "view", "create", "str_replace", "finish")

    def validate(self, task: dict[str, Any]) -> None:
        super().validate(task)
        task_format(task, self.name)
        task = code_fields(task)
        require_str(task, "prompt")
        relative_path(task, "entry_file", "solution.py")
        try:
            parse_tests(task)
        except ValueError as exc:
            raise TaskValidationError(str(exc)) from None
        if task.get("scoring", "fraction") not in ("fraction", "all"):
            raise TaskValidationError('task.scoring: "fraction" (share of tests passed) or "all" (all or nothing)')
        optional_number(task, "timeout_s", 0.1, 600)
        optional_number(task, "memory_mb", 32, 64 * 1024)
        files = task.get("files", {})
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise TaskValidationError("task.files: a map of relative path -> text")
        for field in ("starter_code", "setup_code"):
            if field in task and not isinstance(task[field], str):
                raise TaskValidationError(f"task.{field}: a string")

    def given_rollout(self, task: dict[str, Any], output: str | None) -> dict[str, Any]:
        """A solution file given instead of written by an agent; None: the row's own reference solution."""
        if output is None:
            output = code_fields(task).get("reference_solution")
            if not isinstance(output, str) or not output.strip():
                raise TaskValidationError("task.reference_solution: the row has no reference solution to evaluate")
        return {"final_text": "", "answer": None, "extra": {"solution": output}}
