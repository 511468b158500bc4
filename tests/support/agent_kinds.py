"""Agentic task kinds for end-to-end tests (ROLLOUTS_TASK_MODULES=tests.support.agent_kinds).

`agent-echo` gives the agent bash and finish over a workspace holding `input.txt`;
the reward is 1 when the finish answer equals `task["expected"]`. Its `collect` reads
what the agent left in `out.txt` through the still-running sandbox.

`agent-answer` has only the finish tool, so it needs no sandbox: an episode is LLM turns
(with `stop_on_no_tool_call: false` in the task, a turn without a tool call is nudged) ending
in `finish("\\boxed{...}")`; the reward is 1 when the boxed answer is `task["answer"]`.
The load test runs 200 of these at once, which 200 sandboxes on a 2-core machine could not.
"""

from __future__ import annotations

from typing import Any

from shared.tasks import StageContext, TaskValidationError, register
from workers.kinds.agentic import AgentTask


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


@register
class AnswerAgentKind(AgentTask):
    name = "agent-answer"
    tools = ("finish",)

    def validate(self, task: dict[str, Any]) -> None:
        super().validate(task)
        for field in ("problem", "answer"):
            if not isinstance(task.get(field), str):
                raise TaskValidationError(f"task.{field}: required, a string")

    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "Think step by step, then call finish with your answer in \\boxed{}."},
            {"role": "user", "content": task["problem"]},
        ]

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        from workers.eval.answers import math_answer, trajectory_texts

        final_text, answer = trajectory_texts(ctx.outputs["rollout"])
        found = math_answer(final_text, answer)
        return {"reward": float(found.text == ctx.task["answer"]), "extracted": found.text, "source": found.source}
