"""The built-in `demo` kind's spec: a string to reverse (`text`), and seconds of simulated tool time
per stage (`work_s`). Its stages: workers/kinds/demo.py."""

from __future__ import annotations

from typing import Any

from shared.tasks.base import TaskSpec, TaskValidationError
from shared.tasks.registry import register

MAX_WORK_S = 600.0


@register
class DemoSpec(TaskSpec):
    name = "demo"
    stages = "workers.kinds.demo:DemoKind"

    def validate(self, task: dict[str, Any]) -> None:
        if not isinstance(task.get("text"), str):
            raise TaskValidationError("task.text: required, a string")
        work = task.get("work_s", 0)
        if not isinstance(work, (int, float)) or isinstance(work, bool) or not 0 <= work <= MAX_WORK_S:
            raise TaskValidationError(f"task.work_s: a number of seconds between 0 and {MAX_WORK_S:g}")
