"""What an rq job in the stage queues may hold: JSON data naming a stage entry point, nothing else.

rq's default serializer is pickle, and a job's "data" names the function to call: anyone who can
write to Redis could make a worker unpickle (run) anything, or call any importable function. So
every queue, worker and registry here uses JSON (its loads builds lists, dicts and strings, never
objects), and `StageJob` refuses to call anything but the stage entry points, and to run any
callback but the stage failure callback. A forged job fails without running; a forged callback is
ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rq.job import Job
from rq.serializers import JSONSerializer

from shared.config import STAGES
from shared.errors import RolloutsError

log = logging.getLogger("rollouts.jobs")

# rq imports these by name in the worker process; nothing here imports workers/.
STAGE_FUNCTIONS: dict[str, str] = {stage: f"workers.{stage}.stage.run" for stage in STAGES}
FAILURE_CALLBACK = "workers.runtime.failure.on_stage_failure"

JOB_SERIALIZER = JSONSerializer


class ForbiddenJobFunction(RolloutsError, PermissionError):
    """An rq job named a function that is not a stage entry point (a forged job): it is not called."""


class StageJob(Job):
    """An rq Job that calls only a stage entry point and runs only the stage failure callback."""

    @property
    def func(self) -> Callable[..., Any]:
        name = self.func_name
        if self.instance is not None or name not in STAGE_FUNCTIONS.values():
            raise ForbiddenJobFunction(f"rq job {self.id} names {name!r}, which is not a stage entry point")
        return super().func

    @property
    def failure_callback(self) -> Callable[..., Any] | None:
        if self._failure_callback_name and self._failure_callback_name != FAILURE_CALLBACK:
            _refuse_callback(self, self._failure_callback_name)
            return None
        return super().failure_callback

    @property
    def success_callback(self) -> Callable[..., Any] | None:
        if self._success_callback_name:
            _refuse_callback(self, self._success_callback_name)
        return None

    @property
    def stopped_callback(self) -> Callable[..., Any] | None:
        if self._stopped_callback_name:
            _refuse_callback(self, self._stopped_callback_name)
        return None


def _refuse_callback(job: Job, name: str) -> None:
    log.warning("rq job %s names callback %r, which this service never sets; not running it", job.id, name)
