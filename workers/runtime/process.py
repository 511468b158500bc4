"""A stage's worker process: N slot threads plus a supervisor loop in the main thread.

The supervisor owns what a process has once: signals, heartbeats for busy
slots, the events subscription that delivers cancels, deadline enforcement,
registry maintenance (re-queueing jobs whose worker died) and shutdown.

Shutdown (SIGTERM from scancel or Ctrl-C): slots stop taking jobs; running
jobs get `drain_timeout_s` to finish; what is still running then is handed
back to its stage's queue for another worker. A second signal exits at once;
rq's abandoned-job handling re-queues whatever was in flight.
"""

from __future__ import annotations

import importlib
import logging
import signal
import subprocess
import threading
import time
from types import FrameType

from redis.backoff import ExponentialBackoff
from redis.client import PubSub, PubSubWorkerThread
from redis.exceptions import RedisError
from rq import Queue
from rq.registry import DeferredJobRegistry, FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.timeouts import TimerDeathPenalty
from rq.worker_registration import clean_worker_registry

from shared.backend_pool import BackendPool
from shared.batches.sweep import sweep_batches
from shared.config import STAGES, Settings
from shared.jobs.backend_wait import release_due
from shared.jobs.queues import queue_name, stage_queue
from shared.jobs.status import JobStatus
from shared.lua_scripts import register_lua
from shared.results.sweep import sweep_results
from shared.tasks.context import InterruptReason
from workers.runtime.registry_hygiene import prune_failed_registry, requeue_stranded
from workers.runtime.slots import SlotWorker
from workers.runtime.state import WorkerState, init_state

log = logging.getLogger("rollouts.worker")


class WorkerProcess:
    def __init__(
        self,
        stage: str,
        settings: Settings,
        concurrency: int | None = None,
        drain_timeout_s: float | None = None,
    ) -> None:
        self.stage = stage
        self.concurrency = concurrency or settings.concurrency(stage)
        # The settings the stages get say this process's slot count, also when `--concurrency`
        # overrides it: what is sized by it (the rollout's LLM-call threads) must fit the slots.
        settings = settings.model_copy(update={f"{stage}_concurrency": self.concurrency})
        self.state: WorkerState = init_state(settings, stage)
        self.settings = settings
        self.drain_timeout_s = settings.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        self._stop = threading.Event()
        self._signals = 0
        self._renew = False  # set by the time-limit warning (SIGUSR1)
        self._queue = stage_queue(stage, self.state.redis)
        self.slots = [self._new_slot(index) for index in range(self.concurrency)]
        self._all_queues = [stage_queue(s, self.state.redis) for s in STAGES]
        self._pool = BackendPool(self.state.redis, self.state.store.keys, settings)
        self._release_lock = register_lua(self.state.redis, __package__, "release_if_ours.lua")
        self._threads: list[threading.Thread] = []
        self._pubsub: PubSub | None = None
        self._pubsub_thread: PubSubWorkerThread | None = None

    def _new_slot(self, index: int) -> SlotWorker:
        """Slot `index`'s rq worker; a restarted slot gets a fresh one under the same name."""
        settings = self.settings
        return SlotWorker(
            [self._queue],
            connection=self.state.redis,
            name=f"{self.state.process_name}.{index}",
            poll_interval=min(2.0, settings.heartbeat_interval_s),
            heartbeat_ttl=settings.heartbeat_ttl_s,
            job_monitoring_interval=max(1, int(settings.heartbeat_interval_s)),
            worker_ttl=settings.heartbeat_ttl_s,
        )

    # --- lifecycle --------------------------------------------------------
    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_time_limit_warning)
        log.info("%s: %d slots on queue %r", self.state.process_name, self.concurrency, queue_name(self.stage))
        self._start_events_listener()
        threading.Thread(target=self._warm_up, name="warm-up", daemon=True).start()
        for index, slot in enumerate(self.slots):
            thread = threading.Thread(target=self._run_slot, args=(index,), name=slot.name, daemon=True)
            thread.start()
            self._threads.append(thread)
        # Maintenance probes backends and walks registries: its own thread, so a slow pass never
        # delays the heartbeats and cancels this loop delivers.
        maintenance = threading.Thread(target=self._maintenance_loop, name="maintenance", daemon=True)
        maintenance.start()
        try:
            while not self._stop.wait(self.settings.heartbeat_interval_s):
                self._heartbeat()
        finally:
            self._shutdown()

    def stop(self) -> None:
        self._stop.set()

    def _warm_up(self) -> None:
        """The stage's warm-up (Stage.warm_up), beside the slots: a failure only means the first job loads it."""
        started = time.monotonic()
        try:
            importlib.import_module(f"workers.{self.stage}.stage").STAGE.warm_up()
        except Exception:
            log.exception("%s: warm-up failed; the first jobs load what they need", self.state.process_name)
            return
        log.info("%s: warm-up done %.1fs after the start", self.state.process_name, time.monotonic() - started)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning(
                "%s: second signal, exiting now; in-flight jobs will be re-queued by rq", self.state.process_name
            )
            raise SystemExit(1)
        log.info("%s: %s received, draining", self.state.process_name, signal.Signals(signum).name)
        self.state.draining.set()
        self._stop.set()

    def _on_time_limit_warning(self, signum: int, frame: FrameType | None) -> None:
        """SIGUSR1: the scheduler's warning that the time limit is near. Renew (renew_command), then
        drain as on SIGTERM; the renewal runs on the main loop's way out, not in this handler."""
        log.info("%s: time limit near (SIGUSR1): renewing, then draining", self.state.process_name)
        self._renew = True
        self.state.draining.set()
        self._stop.set()

    def _renew_if_warned(self) -> None:
        command = self.settings.renew_command
        if not self._renew or not command:
            return
        try:
            done = subprocess.run(["bash", "-c", command], timeout=120, capture_output=True, text=True, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.error("renewal failed to run: %s", exc)
            return
        for line in (done.stdout + done.stderr).splitlines():
            log.info("renewal: %s", line)
        if done.returncode != 0:
            log.error("renewal exited %d", done.returncode)

    def _run_slot(self, index: int) -> None:
        """Run slot `index` until the process stops. rq's work loop quits on a Redis error it does not
        retry itself (a ConnectionError in its suspension check, a TimeoutError anywhere); then this
        waits for Redis and starts the slot afresh, so an outage never leaves a process without slots."""
        while not self._stop.is_set():
            slot = self.slots[index]
            try:
                slot.work(logging_level=self.settings.rq_log_level, with_scheduler=False)
            except Exception:
                log.exception("slot %s stopped on an error", slot.name)
            if self._stop.is_set() or slot.stop_requested:
                return
            log.warning("slot %s left rq's work loop; restarting it once Redis answers", slot.name)
            if not self._wait_for_redis():
                return
            _forget_worker(slot)
            self.slots[index] = self._new_slot(index)

    def _wait_for_redis(self) -> bool:
        """Block until Redis answers a PING (True) or the process is stopping (False)."""
        backoff = ExponentialBackoff(cap=1.0, base=0.1)
        failures = 0
        while not self._stop.is_set():
            try:
                self.state.redis.ping()
                return True
            except RedisError:
                failures += 1
                self._stop.wait(backoff.compute(failures))
        return False

    def _shutdown(self) -> None:
        self._renew_if_warned()
        for slot in self.slots:
            slot.request_slot_stop()
        deadline = time.monotonic() + self.drain_timeout_s
        while len(self.state.inflight) and time.monotonic() < deadline:
            self._heartbeat()
            time.sleep(min(0.2, self.settings.heartbeat_interval_s))
        if len(self.state.inflight):
            log.info("%s: handing %d running jobs back to the queue", self.state.process_name, len(self.state.inflight))
            self.state.inflight.interrupt_all(InterruptReason.REQUEUE)
        for thread in self._threads:
            thread.join(timeout=max(1.0, self.settings.heartbeat_interval_s * 2))
        self.state.metrics.flush()
        if self._pubsub_thread is not None:
            self._pubsub_thread.stop()
            self._pubsub_thread.join(timeout=2.0)
        if self._pubsub is not None:
            self._pubsub.close()
        log.info("%s: stopped", self.state.process_name)

    # --- supervision ------------------------------------------------------
    def _heartbeat(self) -> None:
        self.state.metrics.flush()
        for slot in list(self.slots):
            try:
                if slot.busy:
                    slot.heartbeat_busy_job()
                slot.ensure_registered()
            except RedisError as exc:
                # Redis is away: skip the other slots this beat (each call would wait out the client's
                # retries); slots ride it out in rq's loop or are restarted by _run_slot.
                log.warning("heartbeat of %s failed: %s: %s", slot.name, type(exc).__name__, exc)
                break
            except Exception:
                log.exception("heartbeat failed for %s", slot.name)
        self._enforce_cancels_and_deadlines()
        self._release_waiting_jobs()

    def _release_waiting_jobs(self) -> None:
        """Jobs waiting for an LLM backend whose time has come (or that a new backend woke) go back
        on their stage's queue; each beat, so a wake reaches them within a heartbeat interval."""
        if self._stop.is_set():
            return  # a stopping process takes nothing on, and leaves the waiting to the others
        try:
            released = release_due(self.state.store, self.settings)
        except Exception:
            log.exception("could not release jobs waiting for an LLM backend")
            return
        if released:
            log.info("%s: %d jobs waiting for an LLM backend queued again", self.state.process_name, released)

    def _enforce_cancels_and_deadlines(self) -> None:
        """Catch cancels the events channel missed (e.g. across a Redis restart), superseded attempts
        and stages over time."""
        running = self.state.inflight.snapshot()
        if not running:
            return
        try:
            observed = self.state.store.running_state([(ctx.job_id, ctx.stage) for ctx in running])
            by_id = {ctx.job_id: seen for ctx, seen in zip(running, observed)}
        except Exception:
            log.exception("could not read job statuses")
            by_id = {}
        self.state.inflight.enforce(by_id)

    def _maintenance_loop(self) -> None:
        self._maintenance()
        while not self._stop.wait(self.settings.maintenance_interval_s):
            self._maintenance()

    def _maintenance(self) -> None:
        """rq's registry cleanup for every stage's queue, not just this one's, so a job whose
        worker died is retried (or failed) even while its stage has no live worker at all.
        rq's per-queue cleaning lock keeps it to one process at a time, taken here with a short
        expiry (rq's own lasts 899 s: a holder killed mid-cleanup would strand the queue's
        abandoned jobs for 15 minutes); the fleet-wide upkeep below runs in one process per
        interval too."""
        lock_ttl = max(10, 3 * int(self.settings.maintenance_interval_s))
        for queue in self._all_queues:
            try:
                if self.state.redis.set(queue.registry_cleaning_key, self.state.process_name, nx=True, ex=lock_ttl):
                    try:
                        _clean_registries(queue)
                        prune_failed_registry(queue, self.state.store)
                        clean_worker_registry(queue)
                        requeue_stranded(queue, grace_s=self.settings.heartbeat_ttl_s)
                    finally:
                        self._release_if_ours(queue.registry_cleaning_key)
            except Exception:
                log.exception("maintenance of queue %s failed", queue.name)
        try:
            if not self.state.redis.set(
                self.state.store.keys.maintenance_lock,
                self.state.process_name,
                nx=True,
                ex=max(1, int(self.settings.maintenance_interval_s)),
            ):
                return  # another process did the fleet-wide upkeep this interval
        except Exception:
            log.exception("could not take the maintenance lock")
            return
        try:
            self.state.store.trim_indexes()
        except Exception:
            log.exception("trimming job indexes failed")
        try:
            store = self.state.store
            sweep_results(store.redis, store.keys, store.results, self.settings)
        except Exception:
            log.exception("sweeping the results store failed")
        try:
            # Drop silent or failing LLM backends, reap leases of crashed rollouts, fix counts.
            self._pool.maintain()
        except Exception:
            log.exception("backend pool maintenance failed")
        sweep_batches(self.state.store, self.settings.maintenance_interval_s)

    def _release_if_ours(self, key: str) -> None:
        """Delete a lock only while it still holds our name (it may have expired and moved on)."""
        self._release_lock(keys=[key], args=[self.state.process_name])

    def _start_events_listener(self) -> None:
        """One subscription per process delivers cancels to running stages at once."""
        self._pubsub = self.state.redis.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(**{self.state.store.keys.job_events: self._on_event})
        self._pubsub_thread = self._pubsub.run_in_thread(
            sleep_time=1.0, daemon=True, exception_handler=self._on_pubsub_error
        )

    def _on_event(self, message: dict) -> None:
        job_id, _, status = message["data"].decode().partition(" ")
        if status == JobStatus.CANCELLED:
            ctx = self.state.inflight.get(job_id)
            if ctx is not None:
                ctx.interrupt(InterruptReason.CANCELLED)

    def _on_pubsub_error(self, exc: BaseException, pubsub: PubSub, thread: threading.Thread) -> None:
        # Redis went away: keep the thread alive; the status sweep covers the gap.
        log.warning("events subscription interrupted (%s); retrying", exc)
        time.sleep(1.0)


def _forget_worker(slot: SlotWorker) -> None:
    """Mark a stopped slot's rq worker dead if rq could not (Redis was away during its teardown), so its
    replacement may register under the same name; rq's `register_death` does exactly this."""
    try:
        slot.register_death()
    except RedisError as exc:
        log.warning("could not mark %s dead: %s", slot.name, exc)


def _clean_registries(queue: Queue) -> None:
    """rq's clean_registries, with a death penalty that works off the main thread.

    Cleaning the started registry runs the failure callback of each abandoned job under
    the registry's death penalty; rq's default arms SIGALRM, which only the main thread
    may do, and maintenance runs on its own thread.
    """
    for registry_class in (FinishedJobRegistry, StartedJobRegistry, FailedJobRegistry, DeferredJobRegistry):
        registry = registry_class(
            queue.name,
            connection=queue.connection,
            job_class=queue.job_class,
            serializer=queue.serializer,
            death_penalty_class=TimerDeathPenalty,
        )
        registry.cleanup()
