"""The base of every agentic task kind: a sandbox, a multi-turn agent loop, a token-exact trajectory.

A kind (math, stem, code, swe, ...) says what the agent is asked (`messages`), which
tools it gets (`tools`), how its workspace is prepared (`prepare_workspace`), what to
take from the sandbox before it stops (`collect`) and how the result is scored
(`evaluate`). The loop itself (chat template, backend calls, tool calls, stops) is
shared: `rollout` runs it in a sandbox over the job's workspace and returns the
trajectory dict (see docs/TRAJECTORY.md).

The API imports the kinds too (to validate jobs), so the stage libraries keep their heavy
imports (transformers) inside the functions that need them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, ClassVar

from shared.config import Settings
from shared.errors import Loc
from shared.tasks.base import TaskKind, TaskValidationError
from shared.tasks.context import StageContext
from workers.rollout.agent_task import run_agent_task
from workers.rollout.tool_parsers import known_parsers
from workers.sandbox.spec import SandboxSpec
from workers.sandbox.workspace import place_files
from workers.toolserver.schemas import TOOL_NAMES, TOOL_SCHEMAS

# What in a task's `sandbox` decides how code runs, not what it works on (files, setup).
EXECUTION_FIELDS = frozenset({"image", "limits", "network", "env", "workdir"})
DEFAULT_TOOLS: tuple[str, ...] = ("bash", "python", "view", "create", "str_replace", "finish")
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def agent_env(settings: Settings) -> dict[str, str]:
    """Environment for the agent's sandbox: with the local backend, this service's Python
    environment (bound read-only into the sandbox) comes first on PATH, so `python` and
    `python -m pytest` inside work as they do for the evaluator."""
    if settings.sandbox_backend != "local":
        return {}
    return {"PATH": f"{Path(sys.executable).parent}:{_SYSTEM_PATH}"}


class AgentTask(TaskKind):
    """Subclass, set `name` and `tools`, implement `messages` and `evaluate`, decorate with @register.

    The trajectory returned by `rollout` (and seen by `evaluate` as
    `ctx.outputs["rollout"]`) carries the token record plus `final_text` (the last
    assistant turn's text), `answer` (the `finish` tool's `answer`, or None) and
    `extra` (what `collect` returned).
    """

    uses_llm: ClassVar[bool] = True
    tools: ClassVar[tuple[str, ...]] = DEFAULT_TOOLS

    # --- what a kind provides ---------------------------------------------------
    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        """The system and user chat messages of this task instance ({"role", "content"} dicts)."""
        raise NotImplementedError

    def sandbox_spec(self, task: dict[str, Any], settings: Settings) -> SandboxSpec:
        """The sandbox this task runs in: `task["sandbox"]` (its files and setup from anyone, its execution
        settings from an admin or an operator's profile) over the backend's defaults and the agent's PATH."""
        spec = SandboxSpec.model_validate(task.get("sandbox") or {})
        spec.env = {**agent_env(settings), **spec.env}
        return spec

    def execution_settings(self, task: dict[str, Any]) -> list[Loc]:
        sandbox = task.get("sandbox")
        chosen: list[Loc] = []
        if isinstance(sandbox, dict):
            chosen += [("task", "sandbox", name) for name in sorted(EXECUTION_FIELDS & sandbox.keys())]
        if "python" in task:  # the interpreter the evaluator runs the tests with
            chosen.append(("task", "python"))
        return chosen

    def prepare_workspace(self, ctx: StageContext) -> dict[str, Any]:
        """Build the job's state in `ctx.workspace` (init stage); default: create it and place the spec's files."""
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        spec = self.sandbox_spec(ctx.task, ctx.settings)
        place_files(ctx.workspace, spec.files)
        return {"files": sorted(spec.files)}

    def collect(self, ctx: StageContext, sandbox: Any) -> dict[str, Any]:
        """Called at the end of the rollout while the sandbox still runs; returned under "extra"."""
        return {}

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        """Score `ctx.outputs["rollout"]`; must return at least {"reward": float}."""
        raise NotImplementedError

    # --- shared behaviour -------------------------------------------------------
    def validate(self, task: dict[str, Any]) -> None:
        unknown = [name for name in self.tools if name not in TOOL_NAMES]
        if unknown:  # a kind's own bug, but better said at submit time than mid-rollout
            raise TaskValidationError(f"kind {self.name!r} names unknown tools: {', '.join(unknown)}")
        parser = task.get("tool_parser")
        if parser is not None and parser not in known_parsers():
            raise TaskValidationError(f"task.tool_parser: one of {', '.join(known_parsers())}")
        if not isinstance(task.get("stop_on_no_tool_call", False), bool):
            raise TaskValidationError("task.stop_on_no_tool_call: true or false")
        for field in ("max_turns", "max_context_tokens"):
            value = task.get(field)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise TaskValidationError(f"task.{field}: a positive integer")

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The JSON schemas of this kind's tools, in `tools` order, as the chat template gets them."""
        by_name = {schema["function"]["name"]: schema for schema in TOOL_SCHEMAS}
        return [by_name[name] for name in self.tools]

    def init(self, ctx: StageContext) -> dict[str, Any]:
        return self.prepare_workspace(ctx)

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        """Start the sandbox on the workspace, run the agent loop, collect, stop; returns the trajectory."""
        return run_agent_task(self, ctx)
