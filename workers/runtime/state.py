"""Process-wide state of a worker process, built once at start-up and shared by its slot threads."""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis

from shared.config import Settings, get_settings
from shared.jobs.store import JobStore
from shared.keys import Keys
from shared.metrics import MetricsRecorder
from shared.redis_conn import connect
from shared.tasks import load_stage_code, load_task_modules
from workers.runtime.inflight import InflightJobs

log = logging.getLogger("rollouts.worker")


@dataclass
class WorkerState:
    settings: Settings
    redis: Redis
    store: JobStore
    inflight: InflightJobs
    process_name: str
    metrics: MetricsRecorder
    # Set once the process was told to stop: a stage failing now is handed back, not failed.
    draining: threading.Event = field(default_factory=threading.Event)

    def workspace(self, job_id: str) -> Path:
        """Where the job's state lives across stages; removed only by workers/runtime/job_end.py."""
        return self.settings.workspaces / job_id


_state: WorkerState | None = None


def init_state(settings: Settings | None = None, stage: str = "worker") -> WorkerState:
    """Build the process state (idempotent); rq jobs run in this process find it with `state()`."""
    global _state
    if _state is None:
        settings = settings or get_settings()
        redis = connect(settings)
        load_task_modules(settings.task_modules)
        load_stage_code()  # a broken kind module fails the start, not the first job
        keys = Keys(settings.redis_prefix)
        _state = WorkerState(
            settings=settings,
            redis=redis,
            store=JobStore(redis, settings, keys),
            inflight=InflightJobs(),
            process_name=f"{stage}.{socket.gethostname()}.{os.getpid()}",
            metrics=MetricsRecorder(redis, keys.prefix, buffered=True),  # flushed by the supervisor
        )
    return _state


def state() -> WorkerState:
    """The current process's state; also works when a stage runs outside a worker (tests, `rq worker`)."""
    return _state or init_state()
