"""A job's sandbox in the rollout stage: a ready one from the pool when there is one, else its own.

With the pool on (``sandbox_pool``), the job takes a started, warm sandbox of its profile and
the files of its workspace move in (workers/sandbox/handoff.py); without one ready it starts
its own, as before. At the end a ``single-use`` sandbox is stopped; a ``reuse`` one (per kind,
``sandbox_lifetimes``) goes back to the pool, which resets it and offers it again only when
the reset is proven clean. The pool is per worker process, built on the first job.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared.config import Settings
from workers.sandbox import Sandbox, SandboxError, SandboxSpec, create_sandbox
from workers.sandbox.handoff import HandoffError, move_in
from workers.sandbox.owner import new_sandbox_id, runtime_dir_for
from workers.sandbox.pool import SandboxPool
from workers.sandbox.pool_sizing import Demand
from workers.sandbox.profile import SandboxProfile
from workers.sandbox.reset import take_fingerprint
from workers.toolserver.result import ToolResult

log = logging.getLogger("rollouts.rollout")

_pool: tuple[int, SandboxPool] | None = None
_pool_lock = threading.Lock()


def lifetime_for(kind_name: str, settings: Settings) -> str:
    """``single-use`` unless the deployment chose ``reuse`` for this kind."""
    return settings.sandbox_lifetimes.get(kind_name, "single-use")


def worker_demand() -> Demand:
    """This rollout worker's free slots and its queue's depth (read each refill, from Redis)."""
    from shared.jobs.queues import stage_queue
    from workers.runtime.state import state

    st = state()
    free = max(0, st.settings.rollout_concurrency - len(st.inflight))
    return Demand(free_slots=free, queue_depth=stage_queue("rollout", st.redis).count)


def sandbox_pool(settings: Settings) -> SandboxPool | None:
    """This process's pool, or None when ``sandbox_pool`` is off. A worker has one Settings; a process that
    runs stages under other settings (tests) gets a new pool for them, and the old one is closed."""
    global _pool
    if not settings.sandbox_pool:
        return None
    with _pool_lock:
        old = _pool
        if old is None or old[0] != os.getpid() or old[1].settings != settings:
            pool = SandboxPool(settings, worker_demand)
            atexit.register(pool.close)
            _pool = (os.getpid(), pool)
            if old is not None and old[0] == os.getpid():
                threading.Thread(target=old[1].close, name="sandbox-pool-close", daemon=True).start()
        return _pool[1]


class JobSandbox:
    """One job's hold on its sandbox. ``stop`` (a cancel, the deadline, the stage's cleanups) and
    ``finish`` (the rollout's end) may come in any order from any thread; once the sandbox went back
    to the pool for another job, neither touches it again."""

    def __init__(
        self, sandbox: Sandbox, profile: SandboxProfile, lifetime: str, pool: SandboxPool | None, workspace: Path
    ) -> None:
        self.sandbox = sandbox
        self.profile = profile
        self.lifetime = lifetime
        self.pool = pool
        self.workspace = workspace
        self.pooled = False  # taken ready from the pool
        self._lock = threading.Lock()
        self._done = False

    def stop(self) -> None:
        """Stop the sandbox now, unless it is already stopped or being given back."""
        if not self._lock.acquire(blocking=False):
            return  # finish() holds it: the sandbox is being stopped or given back
        try:
            if not self._done:
                self._done = True
                self.sandbox.stop()
        finally:
            self._lock.release()

    @property
    def stopped(self) -> bool:
        """Whether ``stop`` or ``finish`` ran (the sandbox is not this job's to use any more)."""
        with self._lock:
            return self._done

    def disown(self) -> None:
        """This hold no longer owns the sandbox (it went back to the pool's hands); stop and finish do nothing."""
        with self._lock:
            self._done = True

    def finish(self) -> None:
        """The job is done with its sandbox: stop it, or (``reuse``) give it back to be reset."""
        with self._lock:
            if self._done:
                return
            self._done = True
            if self.lifetime == "reuse" and self.pool is not None and self.sandbox.running:
                self.pool.give_back(self.sandbox, self.profile, self.workspace)
            else:
                self.sandbox.stop()


def new_runtime_dir() -> Path:
    """A sandbox's runtime dir: node-local and short (the tool server's Unix socket path must fit in 108 bytes),
    named after a fresh sandbox id of this worker (workers/sandbox/owner.py), so a dead worker's is swept."""
    return runtime_dir_for(new_sandbox_id())


def name_on_record(job_id: str, stage: str, attempt: int, sandbox: Sandbox) -> None:
    """Name the attempt's sandbox on the job's record (``sandboxes`` in GET /v1/jobs/{id}) before it starts,
    so a sandbox an operator finds on a node (its id is in its runtime dir's name and its processes' argv)
    joins to its rollout, even when its worker was killed mid-job. Best effort: a rollout never fails for it."""
    from shared.jobs.record_fields import sandbox_field
    from workers.runtime import state as worker_state

    st = worker_state._state  # only in a worker process: a stage run in a test has no record to name it on
    if st is None:
        return
    try:
        key = st.store.keys.job(job_id)
        if st.redis.exists(key):  # never a stray hash for a job that is gone (or a stage run outside a job)
            st.redis.hset(key, sandbox_field(stage, attempt), sandbox.sandbox_id)
    except Exception as exc:  # noqa: BLE001 - Redis away: the sandbox still runs, the record misses one name
        log.warning("job %s: could not name its sandbox on its record: %s", job_id, exc)


class OnDemandSandbox:
    """A job's sandbox opened at its first tool call (``sandbox_on_demand``), so a rollout that calls no tool
    starts none, takes none from the pool and teaches the pool nothing. ``open`` runs once, on the loop's
    thread; ``finish`` ends what it opened, if anything. A kind's ``collect`` gets this object while nothing
    is open: its ``call`` opens the sandbox, its ``exec`` runs in a sandbox of ``unstarted`` (same spec and
    isolation, no tool server: ``exec`` needs none) and stops it."""

    def __init__(self, open_: Callable[[], JobSandbox], unstarted: Callable[[], Sandbox] | None = None) -> None:
        self._open = open_
        self._unstarted = unstarted
        self._lock = threading.Lock()
        self.held: JobSandbox | None = None

    @property
    def sandbox(self) -> Sandbox | None:
        """The running sandbox, or None while no tool was called."""
        return None if self.held is None else self.held.sandbox

    @property
    def opened(self) -> bool:
        """Whether a tool call opened the sandbox: until one did, nothing ran in the job's workspace."""
        return self.held is not None

    def open(self) -> JobSandbox:
        """The job's sandbox, opened now if this is the first call."""
        with self._lock:
            if self.held is None:
                self.held = self._open()
            return self.held

    def call(self, tool: str, args: dict[str, Any], timeout: float | None = None) -> ToolResult:
        """One tool call in the job's sandbox (opened first if need be)."""
        return self.open().sandbox.call(tool, args, timeout)

    def exec(self, command: str | list[str], timeout: float, **kwargs: Any) -> Any:
        """``Sandbox.exec`` in the open sandbox, else in one of its own, stopped after."""
        opened = self.sandbox
        if opened is not None or self._unstarted is None:
            return (opened or self.open().sandbox).exec(command, timeout, **kwargs)
        box = self._unstarted()
        try:
            return box.exec(command, timeout, **kwargs)
        finally:
            box.stop()

    def finish(self) -> None:
        """The rollout is over: stop (or give back) the sandbox if one was opened."""
        with self._lock:
            held = self.held
        if held is not None:
            held.finish()


def open_job_sandbox(
    spec: SandboxSpec,
    workspace: Path,
    settings: Settings,
    *,
    python: bool,
    lifetime: str,
    pool: SandboxPool | None,
    hold: Callable[[JobSandbox], None] = lambda _held: None,
) -> JobSandbox:
    """The job's sandbox over ``workspace``, started: a ready one from ``pool`` if it has one, else a new one.

    ``hold`` gets the job's hold before anything starts, so a cancel during a start can stop it.
    """
    profile = SandboxProfile.of(spec, settings, python)
    workspace.mkdir(parents=True, exist_ok=True)
    box = pool.take(profile) if pool is not None else None
    if box is not None:
        held = JobSandbox(box, profile, lifetime, pool, workspace)
        hold(held)
        try:
            move_in(box, workspace)
            held.pooled = True
            return held
        except HandoffError as exc:
            held.disown()
            pool.discard(box, str(exc))  # type: ignore[union-attr]
        except BaseException:
            held.stop()
            raise
    held = JobSandbox(create_sandbox(spec, workspace, new_runtime_dir(), settings), profile, lifetime, pool, workspace)
    hold(held)
    held.sandbox.start()  # waits for a turn under the start cap (start_gate.py)
    if held.stopped:  # a cancel or the deadline came while it started: nothing else would stop it now
        held.sandbox.stop()
        raise SandboxError("the job's sandbox was stopped while it started")
    if lifetime == "reuse" and pool is not None:
        take_fingerprint(held.sandbox)  # before the job's first call: what its reset must restore
    return held
