"""A task kind for the sandbox fault tests (ROLLOUTS_TASK_MODULES=tests.reliability.fault_kinds).

`agent-tools` is agent-echo with the python tool too: the kernel is one of the faults.
`agent-finish` has no sandbox, so a stage limit is spent on LLM calls alone.
"""

from __future__ import annotations

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
