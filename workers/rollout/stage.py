"""The rq entry point of the rollout stage (`workers.rollout.stage.run`)."""

from __future__ import annotations

from rq import get_current_job

from workers.runtime.stage_runner import run_stage


def run(job_id: str) -> str:
    job = get_current_job()
    return run_stage("rollout", job_id, worker_name=job.worker_name if job else None)
