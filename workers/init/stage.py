"""The init stage: the kind builds the job's state in its workspace.

`run` is the stage's rq entry point (shared/jobs/queues.py enqueues `workers.init.stage.run`).
"""

from __future__ import annotations

from typing import Any

from shared.tasks import StageContext, TaskKind
from workers.runtime.stage_runner import Stage, run_stage


class InitStage(Stage):
    name = "init"

    def call(self, kind: TaskKind, ctx: StageContext) -> dict[str, Any]:
        return kind.init(ctx)


STAGE = InitStage()


def run(job_id: str) -> str:
    return run_stage(STAGE, job_id)
