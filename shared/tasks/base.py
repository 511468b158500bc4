"""The contract a task kind fulfils: a light spec (`TaskSpec`) the API loads, and the stage code over it
(`TaskKind`) that workers run."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from shared.errors import Loc, ValidationError
from shared.tasks.context import StageContext

# "task.tests[2].code: a string of Python": the field a kind's message starts with, by convention.
_NAMED_FIELD = re.compile(r"^((?:task|given)(?:\.[A-Za-z_]\w*|\[\d+\])*): (.+)$", re.DOTALL)
_LOC_PART = re.compile(r"\[(\d+)\]|\.?([A-Za-z_]\w*)")


class TaskValidationError(ValidationError):
    """A task dict the kind cannot run, and where.

    Kinds start the message with the field ("task.text: required, a string"), which becomes `loc`
    so the API's 422 names `body[3].task.text`; or they pass `loc` themselves. A message naming no
    field leaves `loc` empty: the problem is the job's as a whole.
    """

    def __init__(self, message: str, loc: Loc | str | None = None) -> None:
        if loc is None:
            loc, message = _split_field(message)
        super().__init__(message, loc)


def _split_field(message: str) -> tuple[Loc, str]:
    match = _NAMED_FIELD.match(message)
    if match is None:
        return (), message
    loc = tuple(int(index) if index else name for index, name in _LOC_PART.findall(match.group(1)))
    return loc, match.group(2)


class TaskSpec:
    """A kind's light half: its name, its checks and what the API says about it; no stage code.

    Subclass, set `name` and `stages`, implement `validate` (and `given_rollout` where a row has a
    reference), and decorate with @register. The API and the CLI load only this half, so a spec
    module imports nothing from workers/. `stages` names the kind's stage code, "module:Class", a
    TaskKind subclass of this spec that workers import on first use (shared/tasks/registry.py).
    """

    name: ClassVar[str]
    uses_llm: ClassVar[bool] = False  # True where the rollout calls an LLM backend (the agent loop)
    stages: ClassVar[str | None] = None  # "module:Class" of the stage code; None: this class is the whole kind

    def validate(self, task: dict[str, Any]) -> None:
        """Called by the API before anything is stored: raise TaskValidationError to reject."""

    def execution_settings(self, task: dict[str, Any]) -> list[Loc]:
        """Where `task` chooses how code runs (sandbox network, limits, env, image; server paths; the
        interpreter): only an admin may set these inline, anyone through an operator's profile."""
        return []

    def given_rollout(self, task: dict[str, Any], output: str | None) -> dict[str, Any]:
        """What `rollout` would return had the model produced `output` (an answer, a solution file, a
        patch), or the task's own reference when `output` is None: a job with `given` skips sampling
        and `evaluate` judges this exactly as it judges a rollout. Called by the API too, so raise
        TaskValidationError (naming the field) when the task has no reference to give."""
        raise TaskValidationError(f"given: kind {self.name!r} cannot evaluate a given output")


class TaskKind(TaskSpec):
    """A whole kind, the stage code over its spec: what workers run.

    Either the stage half of a split kind (`class MathKind(MathSpec, AgentTask)`, named by the
    spec's `stages`), or a kind in one class (subclass, set `name`, implement the three stages,
    decorate with @register), whose module the API then imports whole.

    Each stage method runs in a worker of that stage, possibly on another node
    than the stage before: state crosses stages only through `ctx.workspace`
    (shared storage) and the small dict the previous stage returned
    (`ctx.outputs[stage]`), never through a live process.
    """

    def init(self, ctx: StageContext) -> dict[str, Any]:
        """Build the job's state in its workspace (sandbox image, files, repository)."""
        return {}

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        """Run the agent; return the trajectory (a dict, stored as msgpack)."""
        raise NotImplementedError

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        """Score the rollout on a fresh copy of the state; must return at least {"reward": float}."""
        raise NotImplementedError
