"""The built-in `demo` kind: a visible, dependency-free job for a fresh install.

The "agent" reverses a string; the evaluator checks it. Each stage really
touches the job's workspace, so the whole pipeline (state handed from init to
rollout through storage, eval on what rollout left) is exercised before any
model or sandbox is configured. `work_s` simulates tool time per stage.
"""

from __future__ import annotations

from typing import Any

from shared.tasks.base import TaskKind, TaskValidationError
from shared.tasks.context import StageContext
from shared.tasks.registry import register

MAX_WORK_S = 600.0


@register
class DemoKind(TaskKind):
    name = "demo"

    def validate(self, task: dict[str, Any]) -> None:
        if not isinstance(task.get("text"), str):
            raise TaskValidationError("task.text: required, a string")
        work = task.get("work_s", 0)
        if not isinstance(work, (int, float)) or isinstance(work, bool) or not 0 <= work <= MAX_WORK_S:
            raise TaskValidationError(f"task.work_s: a number of seconds between 0 and {MAX_WORK_S:g}")

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
