"""What a stage handler sees: the job, its workspace, its time budget and a way to stop early."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.config import Settings
from shared.jobs.spec import JobRequest
from shared.words import Word


class InterruptReason(Word):
    """Why a stage must stop before its handler returns."""

    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"  # the stage's (or the job's) time limit
    REQUEUE = "requeue"  # hand the job back to its queue (the worker drains, Redis went away)
    SUPERSEDED = "superseded"  # a newer attempt owns the job


class StageInterrupted(Exception):
    """Raised inside a handler by `check()`/`sleep()` once the job is cancelled, over time or handed back."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # an InterruptReason


@dataclass
class StageContext:
    job_id: str
    stage: str
    request: JobRequest  # the job as submitted, parsed once by the stage runner
    outputs: dict[str, Any]
    workspace: Path
    settings: Settings
    deadline: float  # unix time at which the stage (or the whole job) is over its limit
    attempt: int = 1  # this run's fencing token: a newer attempt at the same stage supersedes it
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("rollouts.stage"))
    partial: dict[str, Any] = field(default_factory=dict)  # kept in the record if the stage is cut short
    _stop: threading.Event = field(default_factory=threading.Event)
    _reason: str | None = None
    _on_interrupt: list[Callable[[str], None]] = field(default_factory=list)
    _cleanups: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def task(self) -> dict[str, Any]:
        """The task instance: a plain dict, since its fields are its kind's to define and check."""
        return self.request.task

    @property
    def remaining(self) -> float:
        return max(0.0, self.deadline - time.time())

    @property
    def interrupted(self) -> str | None:
        """The reason the stage must stop, or None while it may go on."""
        if self._reason is None and time.time() >= self.deadline:
            self.interrupt(InterruptReason.TIMED_OUT)
        return self._reason

    def interrupt(self, reason: str) -> None:
        """Ask the handler to stop (from any thread); the first reason wins."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
            callbacks = list(self._on_interrupt)
        self._stop.set()
        for callback in callbacks:
            try:
                callback(reason)
            except Exception:  # a failing hook must not keep the others from running
                self.log.exception("interrupt hook failed for job %s", self.job_id)

    def check(self) -> None:
        """Raise StageInterrupted if the stage must stop. Call it between steps."""
        reason = self.interrupted
        if reason is not None:
            raise StageInterrupted(reason)

    def sleep(self, seconds: float) -> None:
        """Wait, but wake up and raise as soon as the stage is interrupted."""
        self._stop.wait(max(0.0, min(seconds, self.remaining)))
        self.check()

    def on_interrupt(self, callback: Callable[[str], None]) -> None:
        """Run `callback(reason)` when interrupted, e.g. to kill a sandbox a tool call is blocked on."""
        with self._lock:
            already = self._reason
            if already is None:
                self._on_interrupt.append(callback)
        if already is not None:
            callback(already)

    def remove_on_interrupt(self, callback: Callable[[str], None]) -> None:
        """Forget a callback given to `on_interrupt` (its call settled); absent is fine."""
        with self._lock, contextlib.suppress(ValueError):
            self._on_interrupt.remove(callback)

    def on_cleanup(self, callback: Callable[[], None]) -> None:
        """Run `callback()` when the stage ends, however it ends (sandbox teardown)."""
        self._cleanups.append(callback)

    def run_cleanups(self) -> None:
        while self._cleanups:
            callback = self._cleanups.pop()
            try:
                callback()
            except Exception:
                self.log.exception("cleanup failed for job %s", self.job_id)
