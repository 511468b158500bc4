"""The stages running in this process, so cancels and deadlines can reach them from outside."""

from __future__ import annotations

import threading

from shared.jobs.status import JobStatus
from shared.tasks.context import InterruptReason, StageContext


class InflightJobs:
    """Thread-safe map job id -> running StageContext."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._contexts: dict[str, StageContext] = {}

    def add(self, ctx: StageContext) -> None:
        with self._lock:
            self._contexts[ctx.job_id] = ctx

    def remove(self, ctx: StageContext) -> None:
        with self._lock:
            if self._contexts.get(ctx.job_id) is ctx:
                del self._contexts[ctx.job_id]

    def get(self, job_id: str) -> StageContext | None:
        with self._lock:
            return self._contexts.get(job_id)

    def snapshot(self) -> list[StageContext]:
        with self._lock:
            return list(self._contexts.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._contexts)

    def interrupt_all(self, reason: str) -> None:
        for ctx in self.snapshot():
            ctx.interrupt(reason)

    def enforce(self, observed: dict[str, tuple[str | None, int | None]]) -> None:
        """Interrupt stages whose job was cancelled or deleted, whose attempt was superseded by a
        newer one (its worker was wrongly given up for dead), or that are past their deadline.

        `observed` maps job id -> (status, current attempt) as read from Redis just now.
        """
        for ctx in self.snapshot():
            if ctx.job_id in observed:
                status, attempt = observed[ctx.job_id]
                if status is None or status == JobStatus.CANCELLED:
                    ctx.interrupt(InterruptReason.CANCELLED)
                    continue
                if attempt is not None and attempt != ctx.attempt:
                    ctx.interrupt(InterruptReason.SUPERSEDED)
                    continue
            ctx.interrupted  # noqa: B018 - reading it interrupts a stage past its deadline
