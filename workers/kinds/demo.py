"""The built-in `demo` kind's stages (its spec: shared/kinds/demo.py): a visible, dependency-free job.

The "agent" reverses a string; the evaluator checks it. Each stage really
touches the job's workspace, so the whole pipeline (state handed from init to
rollout through storage, eval on what rollout left) is exercised before any
model or sandbox is configured. `work_s` simulates tool time per stage.
"""

from __future__ import annotations

from typing import Any

from shared.kinds.demo import DemoSpec
from shared.tasks.base import TaskKind
from shared.tasks.context import StageContext


class DemoKind(DemoSpec, TaskKind):
    def init(self, ctx: StageContext) -> dict[str, Any]:
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        (ctx.workspace / "input.txt").write_text(ctx.task["text"])
        ctx.sleep(ctx.task.get("work_s", 0))
        return {"files": ["input.txt"]}

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        text = (ctx.workspace / "input.txt").read_text()
        ctx.partial["read"] = text
        ctx.sleep(ctx.task.get("work_s", 0))
        answer = text[::-1]
        (ctx.workspace / "answer.txt").write_text(answer)
        return {"answer": answer, "turns": 1}

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        answer = (ctx.workspace / "answer.txt").read_text()
        ctx.sleep(ctx.task.get("work_s", 0))
        expected = ctx.task["text"][::-1]
        return {"reward": 1.0 if answer == expected else 0.0, "expected": expected, "answer": answer}
