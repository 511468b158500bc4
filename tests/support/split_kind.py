"""A deployment's own kind in two halves, as docs/PIPELINE.md shows: this module is the spec (what the
API imports, through ROLLOUTS_TASK_MODULES); its stage code is tests/support/split_kind_stages.py."""

from __future__ import annotations

from typing import Any

from shared.tasks import TaskSpec, TaskValidationError, register


@register
class EchoSpec(TaskSpec):
    name = "split_echo"
    stages = "tests.support.split_kind_stages:EchoKind"

    def validate(self, task: dict[str, Any]) -> None:
        if not isinstance(task.get("text"), str):
            raise TaskValidationError("task.text: required, a string")
