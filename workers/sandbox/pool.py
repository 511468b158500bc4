"""Ready sandboxes per profile, started ahead of the jobs that will take them.

Starting a sandbox (bwrap, the tool server, its shell; the IPython kernel for kinds that use
``python``) costs hundreds of ms to seconds; made while a job holds a rollout slot, that time is
on the job's critical path. One pool per rollout worker process keeps sandboxes started and
warm, keyed by profile (workers/sandbox/profile.py): a job takes one in the time of a few
renames (workers/sandbox/handoff.py), and a thread refills the pool behind it, through the
same start cap as every other start (start_gate.py). How many are kept follows the worker's
free slots and its queue's depth (pool_sizing.py); profiles no job asked for lately are
stopped; ``sandbox_pool_memory_bytes`` bounds them all. A profile is learned from the first
job that asks for it, which starts cold.

Two lifetimes (docs/SANDBOX.md): ``single-use`` sandboxes are stopped after their job and the
refill replaces them; ``reuse`` sandboxes come back through ``give_back``, are reset and proven
clean (reset.py) and only then offered again; one that cannot be proven clean is stopped.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shared.config import Settings
from workers.sandbox import create_sandbox
from workers.sandbox.handoff import HandoffError, move_out
from workers.sandbox.owner import POOL_DIR, new_sandbox_id, runtime_dir_for, sweep
from workers.sandbox.pool_sizing import Asked, Demand, targets
from workers.sandbox.profile import SandboxProfile
from workers.sandbox.reset import reset_processes, take_fingerprint, warm
from workers.sandbox.sandbox import Sandbox, SandboxError

log = logging.getLogger("rollouts.sandbox.pool")

_WARM_TIMEOUT_S = 120.0
_SWEEP_INTERVAL_S = 60.0  # how often a live pool removes what dead workers of its node left (owner.py)


@dataclass
class PoolStats:
    """What the pool did, for metrics, the benchmark and the tests."""

    handed: int = 0  # jobs that took a ready sandbox
    missed: int = 0  # jobs that found none and started their own
    started: int = 0  # sandboxes the pool started
    start_failures: int = 0
    reused: int = 0  # used sandboxes reset, proven clean and offered again
    discarded: int = 0  # used sandboxes stopped because their reset was not proven clean
    stopped_idle: int = 0  # ready sandboxes stopped: their profile idle, or over the bound
    last_discard: str | None = None


class SandboxPool:
    """Thread-safe; ``take`` and ``give_back`` are called from the slot threads, the refill runs in its own."""

    def __init__(
        self, settings: Settings, demand: Callable[[], Demand], root: Path | None = None, refill: bool = True
    ) -> None:
        """``refill`` False: the pool only holds what jobs give back (``reuse``), and starts nothing itself."""
        self.settings = settings
        self.refill = refill
        self.demand = demand
        self.root = root or settings.workspaces / POOL_DIR
        self.max_ready = settings.sandbox_pool_memory_bytes // settings.sandbox_pool_sandbox_bytes
        self.stats = PoolStats()
        self.unpoolable: str | None = None  # set once sandboxes here cannot be pooled (the fallback)
        self._ready: dict[SandboxProfile, deque[Sandbox]] = {}
        self._asked: dict[SandboxProfile, Asked] = {}
        self._starting: Counter[SandboxProfile] = Counter()
        self._retry_at: dict[SandboxProfile, tuple[float, int]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._swept_at = 0.0
        self._sweep_dead_homes()
        self._thread = threading.Thread(target=self._refill_loop, name="sandbox-pool", daemon=True)
        self._thread.start()

    # --- what a job does --------------------------------------------------------
    def take(self, profile: SandboxProfile) -> Sandbox | None:
        """A ready sandbox of this profile, or None: the caller starts its own (and the pool learns the profile)."""
        with self._cond:
            seen = self._asked.get(profile)
            if seen is None:
                self._asked[profile] = Asked(time.monotonic())
            else:
                seen.last, seen.count = time.monotonic(), seen.count + 1
            ready = self._ready.get(profile)
            box = None
            dead: list[Sandbox] = []
            while ready and box is None:
                candidate = ready.popleft()
                if candidate.running:
                    box = candidate
                else:
                    self.stats.discarded += 1
                    dead.append(candidate)
            if box is None:
                self.stats.missed += 1
            else:
                self.stats.handed += 1
            self._cond.notify_all()  # the refill replaces it
        for candidate in dead:  # died while it waited: stopped outside the lock, the job need not wait
            self._forget(candidate)
        return box

    def give_back(self, sandbox: Sandbox, profile: SandboxProfile, job_workspace: Path) -> bool:
        """Reset a used sandbox (lifetime ``reuse``) and offer it again once its shell (and kernel) are up;
        False: it was not proven clean and is stopped. Either way the job's files stay at ``job_workspace``."""
        why = reset_processes(sandbox)
        if why is None:
            try:
                move_out(sandbox, job_workspace, self._home_of(sandbox))
            except (HandoffError, SandboxError) as exc:
                why = str(exc)
        if why is not None:
            self.discard(sandbox, why)
            return False
        # The job's files are where eval reads them; the shell and kernel start off the job's time.
        with self._cond:
            self._starting[profile] += 1  # on its way back: the refill counts it
        threading.Thread(target=self._rewarm, args=(sandbox, profile), name="sandbox-pool-rewarm", daemon=True).start()
        return True

    def _rewarm(self, sandbox: Sandbox, profile: SandboxProfile) -> None:
        why = warm(sandbox, profile.python, _WARM_TIMEOUT_S)
        if why is not None:
            self.discard(sandbox, why)
            with self._cond:
                self._starting[profile] -= 1
                self._cond.notify_all()
            return
        with self._cond:
            self._starting[profile] -= 1
            if self._closed or self._count_ready() >= self.max_ready:
                self.stats.stopped_idle += 1
                keep = False
            else:
                self._ready.setdefault(profile, deque()).append(sandbox)
                self.stats.reused += 1
                keep = True
            self._cond.notify_all()
        if not keep:
            self._forget(sandbox)

    def discard(self, sandbox: Sandbox, why: str) -> None:
        """Stop a sandbox that must not be handed to anyone (its own pool directory goes with it)."""
        log.info("sandbox discarded, not reused: %s", why)
        with self._cond:
            self.stats.discarded += 1
            self.stats.last_discard = why
        self._forget(sandbox)

    # --- what tests and the benchmark look at ---------------------------------
    def ready_count(self, profile: SandboxProfile | None = None) -> int:
        with self._cond:
            return self._count_ready(profile)

    def ready(self, profile: SandboxProfile) -> list[Sandbox]:
        """The ready sandboxes of a profile, as they are now (the benchmark measures their memory)."""
        with self._cond:
            return list(self._ready.get(profile, ()))

    def wait_ready(self, profile: SandboxProfile, count: int, timeout: float) -> bool:
        """Block until ``count`` sandboxes of ``profile`` are ready (a bound for tests, not a pace)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count_ready(profile) >= count or self._closed, timeout)

    def close(self) -> None:
        """Stop the refill and every ready sandbox; the pool's directories go too."""
        with self._cond:
            self._closed = True
            boxes = [box for ready in self._ready.values() for box in ready]
            self._ready.clear()
            self._cond.notify_all()
        for box in boxes:
            self._forget(box)
        self._thread.join(timeout=30)
        with self._cond:  # starts in flight stop what they started once they see the pool closed
            self._cond.wait_for(lambda: not any(self._starting.values()), timeout=120)

    # --- inside -----------------------------------------------------------------
    def _count_ready(self, profile: SandboxProfile | None = None) -> int:
        if profile is not None:
            return len(self._ready.get(profile, ()))
        return sum(len(ready) for ready in self._ready.values())

    def _home_of(self, sandbox: Sandbox) -> Path:
        """The sandbox's own directory in the pool, named by its id (owner.py: host, owner, random part), so
        that it is unique across the nodes that share the workspaces root and a dead owner's can be swept."""
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root / sandbox.sandbox_id

    def _sweep_dead_homes(self) -> None:
        """Remove what this node's dead workers left (SIGKILL, the OOM killer): pool directories and sandbox
        runtime dirs whose owner no longer runs (owner.py). Other nodes' are theirs to sweep. Run when the
        pool is built and every ``_SWEEP_INTERVAL_S`` after, so a worker killed beside this one is cleaned
        up even if none starts on the node again."""
        self._swept_at = time.monotonic()
        try:
            sweep(self.root)
        except OSError as exc:  # the refill thread must live on; the next sweep tries again
            log.warning("sandbox pool: could not sweep what dead workers left: %s", exc)

    def _forget(self, sandbox: Sandbox) -> None:
        sandbox.stop()
        home = sandbox.workspace
        if home.parent == Path(os.path.realpath(self.root)):  # the pool's own, not a job's workspace
            shutil.rmtree(home, ignore_errors=True)

    def _start_one(self, profile: SandboxProfile) -> Sandbox:
        sandbox_id = new_sandbox_id()
        self.root.mkdir(parents=True, exist_ok=True)
        home = self.root / sandbox_id
        home.mkdir()
        box = create_sandbox(profile.spec(), home, runtime_dir_for(sandbox_id), self.settings)
        if box.poolable is not None:
            shutil.rmtree(home, ignore_errors=True)
            raise _Unpoolable(box.poolable)
        try:
            box.start(spare=True)  # a job's own start goes first (start_gate.py)
            why = warm(box, profile.python, _WARM_TIMEOUT_S)
            if why is not None:
                raise SandboxError(f"pooled sandbox did not warm up: {why}")
            take_fingerprint(box)
        except BaseException:
            box.stop()
            shutil.rmtree(home, ignore_errors=True)
            raise
        return box

    def _start_into(self, profile: SandboxProfile) -> None:
        box: Sandbox | None = None
        try:
            box = self._start_one(profile)
        except _Unpoolable as exc:
            log.warning("sandbox pool off: %s", exc)
            with self._cond:
                self.unpoolable = str(exc)
        except Exception as exc:  # noqa: BLE001 - a failed refill is retried later; jobs start their own meanwhile
            log.warning("sandbox pool could not start a sandbox: %s", exc)
            with self._cond:
                self.stats.start_failures += 1
                failures = self._retry_at.get(profile, (0.0, 0))[1] + 1
                pause = min(self.settings.sandbox_pool_idle_s, self.settings.sandbox_pool_interval_s * 2**failures)
                self._retry_at[profile] = (time.monotonic() + pause, failures)
        with self._cond:
            self._starting[profile] -= 1
            keep = box is not None and not self._closed and self._count_ready() < self.max_ready
            if keep and box is not None:
                self._ready.setdefault(profile, deque()).append(box)
                self.stats.started += 1
                self._retry_at.pop(profile, None)
            self._cond.notify_all()
        if box is not None and not keep:
            self._forget(box)

    def _plan(self, demand: Demand) -> tuple[list[SandboxProfile], list[Sandbox]]:
        """Which profiles to start one more of, and which ready sandboxes to stop (idle or over the bound)."""
        now = time.monotonic()
        wanted = targets(dict(self._asked), demand, now, self.settings.sandbox_pool_idle_s, self.max_ready)
        to_start: list[SandboxProfile] = []
        to_stop: list[Sandbox] = []
        room = self.max_ready - self._count_ready() - sum(self._starting.values())
        for profile, target in wanted.items():
            ready = self._ready.get(profile, deque())
            if target == 0:
                to_stop += list(ready)
                ready.clear()
                continue
            if self._retry_at.get(profile, (0.0, 0))[0] > now:
                continue
            missing = min(target - len(ready) - self._starting[profile], room)
            for _ in range(max(0, missing)):
                to_start.append(profile)
                self._starting[profile] += 1
                room -= 1
        for profile in [p for p, seen in self._asked.items() if now - seen.last > self.settings.sandbox_pool_idle_s]:
            if not self._ready.get(profile) and not self._starting[profile]:
                del self._asked[profile]  # forgotten: its next job starts cold and teaches it again
        self.stats.stopped_idle += len(to_stop)
        return to_start, to_stop

    def _refill_loop(self) -> None:
        while True:
            if time.monotonic() - self._swept_at >= _SWEEP_INTERVAL_S:
                self._sweep_dead_homes()
            try:
                demand = self.demand()
            except Exception as exc:  # noqa: BLE001 - Redis away: keep one ready per profile in use
                log.debug("sandbox pool: demand unknown (%s)", exc)
                demand = Demand(free_slots=0, queue_depth=0)
            with self._cond:
                if self._closed:
                    return
                to_start, to_stop = self._plan(demand)
                if self.unpoolable or not self.refill:
                    for profile in to_start:
                        self._starting[profile] -= 1
                    to_start = []
            for box in to_stop:
                self._forget(box)
            for profile in to_start:
                threading.Thread(
                    target=self._start_into, args=(profile,), name="sandbox-pool-start", daemon=True
                ).start()
            with self._cond:
                if self._closed:
                    return
                self._cond.wait(self.settings.sandbox_pool_interval_s)


class _Unpoolable(SandboxError):
    """Sandboxes here cannot be started ahead of their job (workers/sandbox/sandbox.py ``poolable``)."""
