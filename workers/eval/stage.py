"""The eval stage: the kind scores the rollout; after it the job is done.

`run` is the stage's rq entry point (shared/jobs/queues.py enqueues `workers.eval.stage.run`).
"""

from __future__ import annotations

from typing import Any

from shared.tasks import StageContext, TaskKind
from workers.runtime.stage_runner import Stage, run_stage


class EvalStage(Stage):
    name = "eval"

    def call(self, kind: TaskKind, ctx: StageContext) -> dict[str, Any]:
        return kind.evaluate(ctx)


STAGE = EvalStage()


def run(job_id: str) -> str:
    return run_stage(STAGE, job_id)
