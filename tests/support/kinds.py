"""Task kinds for the pipeline tests, loaded by workers through ROLLOUTS_TASK_MODULES.

`scripted` does what its task says: sleep (cooperatively) in a stage, wait in a
stage until the test creates a file (`hold`, bench/hold.py), fail in a stage, and
write a trace line per event to `<trace>/<job id>.log`, so tests can see from
outside which stages ran, in which process and which attempt.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.hold import hold_stage, validate_hold
from shared.tasks import StageContext, StageInterrupted, TaskKind, TaskValidationError, register


def _trace(ctx: StageContext, event: str) -> None:
    trace_dir = ctx.task.get("trace")
    if trace_dir:
        with open(Path(trace_dir) / f"{ctx.job_id}.log", "a") as out:
            out.write(f"{ctx.stage} {event} attempt={ctx.attempt} pid={os.getpid()}\n")


@register
class ScriptedKind(TaskKind):
    name = "scripted"

    def validate(self, task: dict[str, Any]) -> None:
        if not isinstance(task.get("sleep", {}), dict):
            raise TaskValidationError("task.sleep: a map of stage -> seconds")
        validate_hold(task)

    def _run(self, ctx: StageContext) -> None:
        _trace(ctx, "start")
        ctx.on_cleanup(lambda: _trace(ctx, "cleanup"))
        ctx.partial["progress"] = f"{ctx.stage} started"
        seconds = float(ctx.task.get("sleep", {}).get(ctx.stage, 0))
        if ctx.task.get("sleep_first_attempt_only") and ctx.attempt != 1:
            seconds = 0.0
        try:
            if seconds:
                ctx.sleep(seconds)
            hold_stage(ctx)  # every attempt: only the test's release file ends the hold
        except StageInterrupted:
            if ctx.task.get("crash_when_interrupted"):  # like a sandbox killed by the same signal
                raise RuntimeError("the sandbox died under us") from None
            raise
        if ctx.task.get("fail") == ctx.stage:
            raise RuntimeError(f"scripted failure in {ctx.stage}")
        _trace(ctx, "end")

    def init(self, ctx: StageContext) -> dict[str, Any]:
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        (ctx.workspace / "state.txt").write_text("prepared by init\n")
        self._run(ctx)
        return {"prepared": True}

    def rollout(self, ctx: StageContext) -> dict[str, Any]:
        state = (ctx.workspace / "state.txt").read_text()
        self._run(ctx)
        return {"turns": 1, "saw": state.strip(), "after_init": ctx.outputs["init"]}

    def evaluate(self, ctx: StageContext) -> dict[str, Any]:
        self._run(ctx)
        return {"reward": float(ctx.task.get("reward", 1.0))}
