"""The stage half of every agentic task kind: a sandbox, a multi-turn agent loop, a token-exact trajectory.

A kind (math, stem, code, swe, ...) says what the agent is asked (`messages`), which
tools it gets (`tools`), how its workspace is prepared (`prepare_workspace`), what to
take from the sandbox before it stops (`collect`) and how the result is scored
(`evaluate`). The loop itself (chat template, backend calls, tool calls, stops) is
shared: `rollout` runs it in a sandbox over the job's workspace and returns the
trajectory dict (see docs/TRAJECTORY.md).

Its spec half (the tools, the loop's task fields, what an admin alone may set) is
shared/kinds/agentic.py's `AgentSpec`, which the API loads; only workers import this module.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from shared.config import Settings
from shared.kinds.agentic import AgentSpec
from shared.tasks.base import TaskKind
from shared.tasks.context import StageContext
from workers.eval.fresh_sandbox import SERVICE_PYTEST_ENV
from workers.rollout.agent_task import run_agent_task
from workers.sandbox.spec import SandboxSpec
from workers.sandbox.workspace import place_files

_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def agent_env(settings: Settings) -> dict[str, str]:
    """Environment for the agent's sandbox: with the local backend, this service's Python
    environment (bound read-only into the sandbox) comes first on PATH, so `python` and
    `python -m pytest` inside work as they do for the evaluator (without this service's own pytest plugins)."""
    if settings.sandbox_backend != "local":
        return {}
    return {"PATH": f"{Path(sys.executable).parent}:{_SYSTEM_PATH}", **SERVICE_PYTEST_ENV}


class AgentTask(AgentSpec, TaskKind):
    """Subclass with the kind's spec (`class MathKind(MathSpec, AgentTask)`), implement `messages` and `evaluate`.

    The trajectory returned by `rollout` (and seen by `evaluate` as
    `ctx.outputs["rollout"]`) carries the token record plus `final_text` (the last
    assistant turn's text), `answer` (the `finish` tool's `answer`, or None) and
    `extra` (what `collect` returned).
    """

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
    def init(self, ctx: StageContext) -> dict[str, Any]:
        return self.prepare_workspace(ctx)

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        """Start the sandbox on the workspace, run the agent loop, collect, stop; returns the trajectory."""
        return run_agent_task(self, ctx)
