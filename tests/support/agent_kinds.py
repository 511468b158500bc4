"""An agentic task kind for end-to-end tests (ROLLOUTS_TASK_MODULES=tests.support.agent_kinds).

`agent-echo` gives the agent bash and finish over a workspace holding `input.txt`;
the reward is 1 when the finish answer equals `task["expected"]`. Its `collect` reads
what the agent left in `out.txt` through the still-running sandbox.
"""

from __future__ import annotations

from typing import Any

from shared.tasks import StageContext, register
from shared.tasks.agentic import AgentTask


@register
class EchoAgentKind(AgentTask):
    name = "agent-echo"
    tools = ("bash", "finish")

    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "You are an agent with a shell."},
            {"role": "user", "content": task["prompt"]},
        ]

    def prepare_workspace(self, ctx: StageContext) -> dict[str, Any]:
        prepared = super().prepare_workspace(ctx)
        (ctx.workspace / "input.txt").write_text(ctx.task.get("input", ""))
        return prepared

    def collect(self, ctx: StageContext, sandbox: Any) -> dict[str, Any]:
        result = sandbox.call("bash", {"command": "cat out.txt 2>/dev/null || true"})
        return {"out": result.output.strip()}

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        trajectory = ctx.outputs["rollout"]
        return {"reward": float(trajectory["answer"] == ctx.task.get("expected")), "answer": trajectory["answer"]}
