"""Many rq jobs in flight in one worker process: one rq worker per slot, each on its own thread.

rq runs one job per worker. Rollouts are I/O bound (LLM calls, tool calls), so a
process that waits on one at a time wastes its node. Each slot here is a full
rq worker (SimpleWorker: no fork), so rq's registries, job heartbeats, retries
and failure handling stay exactly rq's, and `rq info` shows every slot. What
threads change is handled here:
- signals: only the process supervisor handles them; slots just stop dequeuing;
- heartbeats: a slot blocked in a long job cannot send its own, so the
  supervisor sends them for every busy slot (rq's Worker.maintain_heartbeats);
- rq's hard timeout uses a timer thread instead of SIGALRM (main thread only);
- dequeue polls in short blocking waits, so a stop request is seen quickly;
- rq's per-worker pub/sub listener is off: cancels reach jobs through the
  service's own events channel, one subscription per process;
- rq's work loop quits on most Redis errors (a ConnectionError in its suspension
  check, a TimeoutError anywhere), which would leave a live process with no slots:
  the supervisor (process.py) starts a fresh SlotWorker under the same name once
  Redis answers again, and re-registers a slot whose rq key Redis lost.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from rq import Queue
from rq.job import Job
from rq.timeouts import TimerDeathPenalty
from rq.worker import SimpleWorker

from shared.jobs.rq_payloads import JOB_SERIALIZER, StageJob

# Slots never clean registries themselves (see run_maintenance_tasks).
_NEVER = 10**9


class SlotWorker(SimpleWorker):
    death_penalty_class = TimerDeathPenalty
    # rq's dequeue loop waits between reconnects, doubling up to this cap (rq's own is 60 s): a
    # slot resumes within a couple of seconds of Redis' return, not a minute after it.
    max_connection_wait_time = 2.0

    def __init__(self, *args: Any, poll_interval: float, heartbeat_ttl: int, **kwargs: Any) -> None:
        # JSON payloads naming only stage entry points (shared/jobs/rq_payloads.py), never pickles.
        super().__init__(*args, maintenance_interval=_NEVER, serializer=JOB_SERIALIZER, job_class=StageJob, **kwargs)
        self._poll_interval = max(1, int(poll_interval))
        self._heartbeat_ttl = heartbeat_ttl
        self._busy_lock = threading.Lock()
        self._busy_job: Job | None = None
        self._in_work_loop = False  # between rq's bootstrap (birth) and teardown (death)

    # --- threads, not processes -------------------------------------------
    def _install_signal_handlers(self) -> None:
        """Signals go to the supervisor, which stops the slots."""

    def subscribe(self) -> None:
        """No per-slot pub/sub connection (see module docstring)."""

    def unsubscribe(self) -> None:
        pass

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        super().bootstrap(*args, **kwargs)
        self._in_work_loop = True

    def teardown(self) -> None:
        self._in_work_loop = False
        super().teardown()

    def run_maintenance_tasks(self) -> None:
        """Never from a slot: rq would run it once at start-up under its 899 s cleaning lock, and a
        slot killed meanwhile would strand the queue's abandoned jobs; the supervisor does it."""

    def request_slot_stop(self) -> None:
        self._stop_requested = True

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def ensure_registered(self) -> None:
        """Register again if Redis lost this worker's key (an outage past its TTL, a restore from an
        older file); rq's heartbeat alone would recreate a hash with no birth, invisible to status."""
        if not self._in_work_loop:
            return  # not started yet, or stopped and about to be replaced
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.hexists(self.key, "birth")
            pipe.sismember(self.redis_workers_keys, self.key)
            if all(pipe.execute()):
                return
        self.connection.delete(self.key)
        self.register_birth()
        self.set_state("busy" if self.busy else "idle")

    def get_heartbeat_ttl(self, job: Job) -> int:
        return self._heartbeat_ttl

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        while not self._stop_requested:
            result = super().dequeue_job_and_maintain_ttl(self._poll_interval, max_idle_time=self._poll_interval)
            if result is not None:
                return result
        return None

    # --- heartbeats sent by the supervisor --------------------------------
    def execute_job(self, job: Job, queue: Queue) -> None:
        with self._busy_lock:
            self._busy_job = job
        try:
            super().execute_job(job, queue)
        finally:
            with self._busy_lock:
                self._busy_job = None

    @property
    def busy(self) -> bool:
        return self._busy_job is not None

    def heartbeat_busy_job(self) -> None:
        """Extend the running job's StartedJobRegistry entry, as rq's forking worker does from its monitor."""
        with self._busy_lock:
            job = self._busy_job
        if job is None or self.execution is None:
            return
        with contextlib.suppress(AttributeError):  # the job finished after the check: nothing to extend
            self.maintain_heartbeats(job)
