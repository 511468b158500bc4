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

import time
from pathlib import Path
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


@register
class ParityAgentKind(AgentTask):
    """`agent-answer`'s episode with a reward the tiny model's random text still varies: 1 when the trajectory
    generated an even number of tokens. With `task.token_rewards`, the evaluation also gives per-token rewards
    (aligned with `token_ids`: 0.01 on each generated token), as a kind with shaped rewards would; with
    `task.fail_eval` its evaluation raises (the job fails, for the bridges' failure tests); with `task.eval_gate`
    (a path) its evaluation waits while that file exists, up to 120 s (a test cancels a job meanwhile)."""

    name = "agent-parity"
    tools = ("finish",)

    def validate(self, task: dict[str, Any]) -> None:
        super().validate(task)
        if not isinstance(task.get("problem"), str):
            raise TaskValidationError("task.problem: required, a string")

    def messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "Answer, then call finish."},
            {"role": "user", "content": task["problem"]},
        ]

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        if ctx.task.get("fail_eval"):  # a test double's evaluation failure: the job fails, it gets no reward
            raise RuntimeError("evaluation fails by request")
        gate, deadline = ctx.task.get("eval_gate"), time.monotonic() + 120
        while gate and Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        trajectory = ctx.outputs["rollout"]
        generated = sum(trajectory["loss_mask"])
        out: dict[str, Any] = {"reward": float(generated % 2 == 0), "generated": generated}
        if ctx.task.get("token_rewards"):
            out["token_rewards"] = [0.01 * m for m in trajectory["loss_mask"]]
        return out
