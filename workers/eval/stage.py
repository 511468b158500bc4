"""The rq entry point of the eval stage (`workers.eval.stage.run`)."""

from __future__ import annotations

from rq import get_current_job

from workers.runtime.stage_runner import run_stage


def run(job_id: str) -> str:
    job = get_current_job()
    return run_stage("eval", job_id, worker_name=job.worker_name if job else None)
