"""The contract a task kind fulfils; one class per kind, in one module."""

from __future__ import annotations

from typing import Any, ClassVar

from shared.tasks.context import StageContext


class TaskValidationError(ValueError):
    """A task dict the kind cannot run; the message names the offending field."""


class TaskKind:
    """Subclass, set `name`, implement the three stages, and decorate with @register.

    Each stage method runs in a worker of that stage, possibly on another node
    than the stage before: state crosses stages only through `ctx.workspace`
    (shared storage) and the small dict the previous stage returned
    (`ctx.outputs[stage]`), never through a live process.
    """

    name: ClassVar[str]
    uses_llm: ClassVar[bool] = False  # True where the rollout calls an LLM backend (the agent loop)

    def validate(self, task: dict[str, Any]) -> None:
        """Called by the API before anything is stored: raise TaskValidationError to reject."""

    def init(self, ctx: StageContext) -> dict[str, Any]:
        """Build the job's state in its workspace (sandbox image, files, repository)."""
        return {}

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        """Run the agent; return the trajectory (a dict, stored as msgpack)."""
        raise NotImplementedError

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        """Score the rollout on a fresh copy of the state; must return at least {"reward": float}."""
        raise NotImplementedError

    def given_rollout(self, task: dict[str, Any], output: str | None) -> dict[str, Any]:
        """What `rollout` would return had the model produced `output` (an answer, a solution file, a
        patch), or the task's own reference when `output` is None: a job with `given` skips sampling
        and `evaluate` judges this exactly as it judges a rollout. Called by the API too, so raise
        TaskValidationError (naming the field) when the task has no reference to give."""
        raise TaskValidationError(f"given: kind {self.name!r} cannot evaluate a given output")
