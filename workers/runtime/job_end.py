"""The workers' part of a job's end: done, failed, cancelled, timed out, or gone.

The stage runner and rq's failure callback each call `worker_job_ended` from one place, with an
`Ended` saying how the job ended. Only here is a workspace removed. A superseded attempt never
gets here: the job, and its workspace, belong to the newer attempt.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.batches.replenish import UNKNOWN, Unknown
from shared.job_end import job_ended, release_pin
from shared.jobs.store import JobStore
from shared.metrics import MetricsRecorder

log = logging.getLogger("rollouts.worker")


@dataclass(frozen=True)
class Ended:
    """How a job ended, as the worker that saw it knows it."""

    status: str  # the terminal status; "" when the record is gone (expired or deleted)
    # True when this worker's own transition ended the job; False when it found the job over
    # (cancelled by the API, or a race lost to a cancel): the mover told the batch already.
    moved: bool
    error: dict[str, Any] | None = None  # what ended it, counted in the metrics when `moved`
    group_id: str | Unknown | None = UNKNOWN


def worker_job_ended(store: JobStore, job_id: str, ended: Ended, metrics: MetricsRecorder | None = None) -> None:
    """Metrics and the batch (when this worker moved the job), the backend pin, then the workspace."""
    if ended.moved:
        if ended.error is not None and metrics is not None:
            metrics.error(str(ended.error.get("stage", "")), str(ended.error.get("type", "unknown")))
        job_ended(store, job_id, ended.group_id)
    else:
        release_pin(store, job_id)
    _remove_workspace(store.settings.workspaces / job_id)
    log.debug("job %s: %s; its pin and workspace are gone", job_id, ended.status or "no record")


def _remove_workspace(path: Path) -> None:
    """Remove exactly this job's workspace, nothing around it."""
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
