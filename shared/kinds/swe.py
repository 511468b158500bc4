"""The `swe` kind's spec: fix a repository so its failing tests pass, judged like SWE-bench.

The task is a SWE-bench-style instance (shared/kinds/swe_instance.py reads its fields); its
repository must be reachable where workers run: `repo_path` (a directory on the workers, so an
admin's setting), the deployment's mirror, or the Singularity image. Its stages (the repository,
the agent's diff, the judging): workers/kinds/swe.py.
"""

from __future__ import annotations

from typing import Any, ClassVar

from shared.errors import Loc
from shared.kinds.agentic import AgentSpec
from shared.kinds.formats import task_format
from shared.kinds.swe_instance import SweInstance, from_image, mirror_repository
from shared.kinds.task_fields import optional_number
from shared.tasks.base import TaskValidationError
from shared.tasks.registry import register


@register
class SweSpec(AgentSpec):
    name = "swe"
    stages = "workers.kinds.swe:SweKind"
    tools: ClassVar[tuple[str, ...]] = ("bash", "view", "create", "str_replace", "finish")

    def validate(self, task: dict[str, Any]) -> None:
        super().validate(task)
        task_format(task, self.name)
        instance = SweInstance.from_task(task)
        instance.test_plan()
        if not instance.repo_path and not from_image(instance) and mirror_repository(instance.repo) is None:
            instance.source()  # raises, naming task.repo_path and the mirror setting
        optional_number(task, "test_timeout_s", 1, 3600)
        optional_number(task, "memory_mb", 64, 256 * 1024)

    def execution_settings(self, task: dict[str, Any]) -> list[Loc]:
        server_path = [("task", "repo_path")] if task.get("repo_path") else []  # a directory on the workers
        return [*super().execution_settings(task), *server_path]

    def given_rollout(self, task: dict[str, Any], output: str | None) -> dict[str, Any]:
        """A patch given instead of an agent's diff; None: the row's gold `patch`."""
        if output is None:
            output = SweInstance.from_task(task).gold_patch
            if not output or not output.strip():
                raise TaskValidationError("task.patch: the row has no gold patch to evaluate")
        return {"final_text": "", "answer": None, "extra": {"diff": output}}
