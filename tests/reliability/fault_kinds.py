"""A task kind for the sandbox fault tests (ROLLOUTS_TASK_MODULES=tests.reliability.fault_kinds).

`agent-tools` is agent-echo with the python tool too: the kernel is one of the faults.
`agent-finish` has no sandbox, so a stage limit is spent on LLM calls alone.
`agent-notes` writes on the workspace's filesystem after the agent (in eval): a full disk fails it.
"""

from __future__ import annotations

import json
from typing import Any

from shared.tasks import StageContext, register
from tests.support.agent_kinds import EchoAgentKind


@register
class ToolsAgentKind(EchoAgentKind):
    name = "agent-tools"
    tools = ("bash", "python", "finish")


@register
class FinishAgentKind(EchoAgentKind):
    """Only the finish tool, so no sandbox: a rollout that is nothing but LLM calls."""

    name = "agent-finish"
    tools = ("finish",)

    def collect(self, ctx: StageContext, sandbox: Any) -> dict[str, Any]:
        return {}


@register
class NotesAgentKind(ToolsAgentKind):
    """agent-tools whose eval writes a note into the job's workspace after scoring.

    None of the built-in kinds writes on the workspaces' filesystem after the rollout (the
    trajectory goes to Redis, eval judges a node-local copy), but a kind may keep state there
    between stages (as `demo` does): this one shows what a disk the agent left full does to it.
    """

    name = "agent-notes"

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        scored = super().evaluate(ctx)
        (ctx.workspace / "judged.json").write_text(json.dumps(scored))
        return scored
