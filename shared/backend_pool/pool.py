"""The LLM backend pool: registration, health, and least-loaded sticky selection in Redis.

Every rollout worker shares one view of the pool through Redis, so selection must be
atomic across processes: one Lua script (acquire.lua) reads the pin of a
route, keeps it while its backend is usable, and otherwise picks the backend with the
lowest in-flight / capacity score, charging the trajectory to it in the same step.

In-flight counts are per trajectory, not per call: a trajectory is charged to exactly
one backend (the ``charges`` hash) from its first acquire until its release, so group
pinning (n trajectories sharing one route) still counts n. Counts are derived state: a
crashed rollout's lease expires and is reaped, and a periodic recount from ``charges``
corrects anything else (see ``maintain``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from redis import Redis

from shared.backend_pool.probe import ProbeError, probe_health, served_models
from shared.config import Settings
from shared.errors import RolloutsError, ValidationError
from shared.keys import Keys
from shared.lua_scripts import register_lua

log = logging.getLogger(__name__)

# acquire re-picks when the chosen backend is deregistered before its address is read.
_ACQUIRE_ATTEMPTS = 3


class NoBackendAvailable(RolloutsError, RuntimeError):
    """No healthy, non-draining backend is registered; the caller should wait and retry."""


@dataclass(frozen=True)
class Backend:
    """One registered backend as the pool sees it."""

    id: str
    url: str
    model: str
    capacity: float
    labels: dict[str, str] = field(default_factory=dict)
    tokenizer: str = ""  # local dir of the served model's tokenizer (vLLM's /v1/models `root`)
    healthy: bool = True
    draining: bool = False
    inflight: int = 0
    registered_at: float = 0.0
    last_heartbeat: float = 0.0
    unhealthy_reason: str = ""
    # The version its owner (a trainer that updates the weights in place) declared it serves; "" when
    # the service loads its weights (then vLLM's own labels name the version).
    weight_version: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "url": self.url,
            "model": self.model,
            "tokenizer": self.tokenizer,
            "capacity": self.capacity,
            "labels": self.labels,
            "healthy": self.healthy,
            "draining": self.draining,
            "inflight": self.inflight,
            "registered_at": self.registered_at,
            "last_heartbeat": self.last_heartbeat,
            "unhealthy_reason": self.unhealthy_reason,
            "weight_version": self.weight_version,
        }


@dataclass(frozen=True)
class Pin:
    """What ``acquire`` hands the agent loop: where to send this call."""

    backend_id: str
    url: str
    model: str
    route_key: str
    repinned: bool
    tokenizer: str = ""


@dataclass
class MaintenanceReport:
    """What one ``maintain`` pass changed (for logs and tests)."""

    missed_heartbeats: list[str] = field(default_factory=list)
    failed_probes: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    reaped_leases: int = 0
    corrected_counts: int = 0


def backend_id_for(url: str) -> str:
    """A stable id from the URL, so a restarted backend re-registering is the same backend."""
    return "b-" + hashlib.sha1(url.rstrip("/").encode()).hexdigest()[:12]


# The reason given to a backend that answers 404 for its registered model (restarted with another
# one): its /health still passes, so only a new registration, naming what it serves, brings it back.
NOT_SERVING_MODEL = "no longer serves model"


# The reason given to a backend that failed a weight update (shared/weights/update.py): it is up and
# passes /health, but serves weights the model no longer has; only a later update that succeeds on it
# (or a new registration) brings it back.
STALE_WEIGHTS = "stale weights"


def _probe_cannot_restore(backend: Backend) -> bool:
    """Unhealthy for a reason a passing /health probe says nothing about."""
    return backend.unhealthy_reason.startswith((NOT_SERVING_MODEL, STALE_WEIGHTS))


class NotAModelServer(ValidationError):
    """A registration whose URL is not an OpenAI-compatible server serving the named model; `field` says
    which of the two is at fault (`url` or `model`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, (field,))


def check_serves_model(url: str, model: str, timeout_s: float, key: str | None = None) -> str:
    """Ask the server what it serves (GET /v1/models); returns the model's `root`, vLLM's local path of it.

    Raises NotAModelServer naming the field at fault: the URL (unreachable, not an OpenAI-compatible
    server) or the model (the server serves others).
    """
    try:
        served = served_models(url, timeout_s, key)
    except ProbeError as exc:
        raise NotAModelServer("url", str(exc)) from None
    if model not in served:
        raise NotAModelServer("model", f"{url} serves {sorted(served)}, not {model!r}")
    return served[model]


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


class BackendPool:
    """Registration, health and selection of LLM backends; every method is safe across processes."""

    def __init__(self, redis: Redis, keys: Keys, settings: Settings) -> None:
        self.redis = redis
        self.keys = keys
        self.settings = settings
        self._acquire = register_lua(redis, __package__, "acquire.lua")
        self._release = register_lua(redis, __package__, "release.lua")
        self._sync = register_lua(redis, __package__, "sync.lua")
        self._reconcile = register_lua(redis, __package__, "reconcile.lua")
        # Update fields of a backend only while it is registered: a heartbeat or drain racing a
        # deregistration must not resurrect a half-filled hash.
        self._hset_if_exists = register_lua(redis, __package__, "hset_if_exists.lua")

    # --- keys the selection scripts share --------------------------------
    @property
    def _selection_keys(self) -> list[str]:
        k = self.keys
        return [
            k.backend_load,
            k.backend_usable,
            k.backend_inflight,
            k.backend_capacity,
            k.llm_routes,
            k.llm_route_refs,
            k.llm_charges,
            k.llm_leases,
            k.llm_lease_routes,
            k.backend_models,
        ]

    def _sync_backend(self, backend_id: str) -> None:
        k = self.keys
        self._sync(
            keys=[
                k.backend(backend_id),
                k.backend_ids,
                k.backend_usable,
                k.backend_load,
                k.backend_inflight,
                k.backend_capacity,
                k.backend_models,
            ],
            args=[backend_id],
        )

    # --- registration -----------------------------------------------------
    def register(
        self,
        url: str,
        model: str,
        capacity: float = 1.0,
        labels: dict[str, str] | None = None,
        backend_id: str | None = None,
        tokenizer: str = "",
        unhealthy_reason: str = "",
    ) -> Backend:
        """Add (or refresh) a backend; it is healthy at once, and open to new pins unless drained.
        With `unhealthy_reason` (e.g. stale weights) it is registered out of selection, in the same step.

        ``tokenizer``: a directory the workers can read with the served model's tokenizer and chat
        template (rollout workers render prompts with it; without one, jobs on this backend fail
        as infrastructure errors).
        """
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        backend_id = backend_id or backend_id_for(url)
        now = time.time()
        key = self.keys.backend(backend_id)
        with self.redis.pipeline() as pipe:
            pipe.hsetnx(key, "registered_at", now)
            # A restarted launcher re-registering must not undo an operator's drain.
            pipe.hsetnx(key, "draining", 0)
            # A (re-)registered server serves the weights it started with until its owner declares others.
            pipe.hdel(key, "weight_version")
            pipe.hset(
                key,
                mapping={
                    "url": url.rstrip("/"),
                    "model": model,
                    "tokenizer": tokenizer,
                    "capacity": capacity,
                    "labels": json.dumps(labels or {}),
                    "healthy": 0 if unhealthy_reason else 1,
                    "unhealthy_reason": unhealthy_reason,
                    "last_heartbeat": now,
                },
            )
            pipe.execute()
        self._sync_backend(backend_id)
        self._wake_waiting_jobs(backend_id)
        backend = self.get(backend_id)
        assert backend is not None
        return backend

    def heartbeat(self, backend_id: str) -> bool:
        """Record a beat; a backend dropped only for missed beats comes back. False: unknown id."""
        key = self.keys.backend(backend_id)
        fields = self.redis.hmget(key, "url", "healthy", "unhealthy_reason")
        if fields[0] is None:
            return False
        now = time.time()
        if not self._hset_if_exists(keys=[key], args=["last_heartbeat", now]):
            return False
        if _text(fields[1]) != "1" and _text(fields[2]).startswith("missed heartbeats"):
            self.set_health(backend_id, True)
        return True

    def declare_version(self, backend_id: str, version: str) -> bool:
        """Record the weight version a trainer-owned backend now serves (nothing is loaded). False: unknown id."""
        return bool(self._hset_if_exists(keys=[self.keys.backend(backend_id)], args=["weight_version", version]))

    def declared_version(self, backend_id: str) -> str:
        """The version declared for the backend ("" for a service-owned one): what its turns are labelled with."""
        return _text(self.redis.hget(self.keys.backend(backend_id), "weight_version"))

    def deregister(self, backend_id: str) -> bool:
        """Remove a backend; its trajectories re-pin at their next call. False: unknown id."""
        removed = self.redis.delete(self.keys.backend(backend_id))
        self._sync_backend(backend_id)
        return bool(removed)

    def drain(self, backend_id: str, draining: bool = True) -> bool:
        """Close (or reopen) a backend to new pins; pinned trajectories finish there."""
        if not self._hset_if_exists(keys=[self.keys.backend(backend_id)], args=["draining", int(draining)]):
            return False
        self._sync_backend(backend_id)
        self._wake_waiting_jobs(backend_id)
        return True

    def set_health(self, backend_id: str, healthy: bool, reason: str = "") -> bool:
        """Mark a backend (un)healthy; an unhealthy one leaves selection, its routes re-pin."""
        fields = ["healthy", int(healthy), "unhealthy_reason", "" if healthy else reason]
        if not self._hset_if_exists(keys=[self.keys.backend(backend_id)], args=fields):
            return False
        self._sync_backend(backend_id)
        if healthy:
            self._wake_waiting_jobs(backend_id)
        else:
            log.warning("backend %s unhealthy: %s", backend_id, reason)
        return True

    def _wake_waiting_jobs(self, backend_id: str) -> None:
        """A backend is open to new pins: every job waiting for one is due now (the workers' next
        heartbeat re-queues them); a job it does not suit (another model) just waits again."""
        if self.redis.zscore(self.keys.backend_load, backend_id) is not None:
            # ZUNIONSTORE of the set onto itself with weight 0: every score becomes 0, in one command.
            self.redis.zunionstore(self.keys.llm_waiting, {self.keys.llm_waiting: 0})

    # --- reads ------------------------------------------------------------
    def get(self, backend_id: str) -> Backend | None:
        raw = self.redis.hgetall(self.keys.backend(backend_id))
        if not raw:
            return None
        inflight = self.redis.hget(self.keys.backend_inflight, backend_id)
        return self._backend(backend_id, raw, int(inflight or 0))

    def backends(self) -> list[Backend]:
        ids = sorted(_text(i) for i in self.redis.smembers(self.keys.backend_ids))
        if not ids:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            for backend_id in ids:
                pipe.hgetall(self.keys.backend(backend_id))
            pipe.hmget(self.keys.backend_inflight, ids)
            *hashes, counts = pipe.execute()
        return [
            self._backend(backend_id, raw, int(count or 0))
            for backend_id, raw, count in zip(ids, hashes, counts)
            if raw
        ]

    @staticmethod
    def _backend(backend_id: str, raw: dict, inflight: int) -> Backend:
        f = {_text(k): _text(v) for k, v in raw.items()}
        return Backend(
            id=backend_id,
            url=f.get("url", ""),
            model=f.get("model", ""),
            tokenizer=f.get("tokenizer", ""),
            capacity=float(f.get("capacity") or 1),
            labels=json.loads(f.get("labels") or "{}"),
            healthy=f.get("healthy") == "1",
            draining=f.get("draining") == "1",
            inflight=inflight,
            registered_at=float(f.get("registered_at") or 0),
            last_heartbeat=float(f.get("last_heartbeat") or 0),
            unhealthy_reason=f.get("unhealthy_reason", ""),
            weight_version=f.get("weight_version", ""),
        )

    # --- selection --------------------------------------------------------
    def route_key(self, job_id: str, group_id: str | None = None) -> str:
        """The pin a trajectory uses: its group's when group pinning is on, else its own."""
        if self.settings.llm_pin_per_group and group_id:
            return f"g:{group_id}"
        return f"j:{job_id}"

    def acquire(
        self, job_id: str, group_id: str | None = None, exclude: Iterable[str] = (), model: str | None = None
    ) -> Pin:
        """Where this trajectory's next LLM call goes; call it before every call.

        The first call charges the trajectory to its route's pin (the least-loaded backend
        open to new pins when the route has none, or its pin is draining or unhealthy);
        later calls return the backend it is charged to while that is usable (draining
        included), and re-pin (moving the charge) once it is not. ``exclude``: backends
        that already failed this call, never returned (the route re-pins away from them);
        NoBackendAvailable when nothing else is open. ``model``: only backends serving it
        (a trajectory's tokens mean nothing to another model). A route's pin more than
        ``llm_load_ceiling`` in-flight per capacity above the least-loaded backend yields new
        trajectories to the least loaded. Also refreshes the trajectory's lease.
        """
        route = self.route_key(job_id, group_id)
        avoid = [b for b in dict.fromkeys(exclude) if b]
        for _ in range(_ACQUIRE_ATTEMPTS):
            expiry = time.time() + self.settings.llm_pin_ttl_s
            ceiling = self.settings.llm_load_ceiling
            result = self._acquire(
                keys=self._selection_keys,
                args=[job_id, route, expiry, model or "", ceiling, self.keys.backend(""), *avoid],
            )
            if not result:
                detail = f" besides {', '.join(avoid)}" if avoid else ""
                serving = f" serving model {model!r}" if model else ""
                raise NoBackendAvailable(f"no healthy, non-draining LLM backend{serving} is registered{detail}")
            backend_id, repinned = _text(result[0]), bool(result[1])
            url, served, tokenizer = (_text(v) for v in result[2:5])
            if not url:
                # Deregistered between the script and the read: bring its sets in line (the
                # deregistration may not have synced yet) and pick again.
                log.info("backend %s vanished while route %s was pinned to it; re-picking", backend_id, route)
                self._sync_backend(backend_id)
                continue
            if repinned:
                log.info("route %s re-pinned to %s", route, backend_id)
            return Pin(
                backend_id=backend_id, url=url, model=served, route_key=route, repinned=repinned, tokenizer=tokenizer
            )
        raise NoBackendAvailable("LLM backends kept disappearing while being picked")

    def release(self, job_id: str) -> bool:
        """The trajectory ended: uncharge its backend, drop its share of the pin. Idempotent."""
        return bool(self._release(keys=self._selection_keys, args=["-", job_id]))

    def touch(self, job_id: str) -> bool:
        """Extend a trajectory's lease during a long tool call (acquire does this too)."""
        expiry = time.time() + self.settings.llm_pin_ttl_s
        return bool(self.redis.zadd(self.keys.llm_leases, {job_id: expiry}, xx=True, ch=True))

    def report_failure(self, backend_id: str, error: str) -> bool:
        """A call to this backend failed: probe it now; True if it is still healthy."""
        backend = self.get(backend_id)
        if backend is None:
            return False
        reason = probe_health(backend.url, self.settings.llm_probe_timeout_s, self.settings.backend_token)
        if reason is None:
            return True
        self.set_health(backend_id, False, f"{reason} (after: {error})")
        return False

    # --- maintenance ------------------------------------------------------
    def maintain(self, probe: bool = True, reap_batch: int = 1000) -> MaintenanceReport:
        """One pass of health and count upkeep; run it every few seconds from one or more processes.

        Drops backends that missed heartbeats, probes the rest (when ``probe``), brings
        back those whose probe passes again, reaps expired trajectory leases and
        recounts in-flight from the charges. Every step is idempotent, so concurrent
        passes from several processes are harmless.
        """
        report = MaintenanceReport()
        now = time.time()
        stale_before = now - self.settings.llm_heartbeat_timeout_s
        alive = []
        for backend in self.backends():
            if backend.last_heartbeat >= stale_before:
                alive.append(backend)
            elif backend.healthy:
                age = now - backend.last_heartbeat
                self.set_health(backend.id, False, f"missed heartbeats ({age:.0f}s silent)")
                report.missed_heartbeats.append(backend.id)
        if probe:
            for backend, reason in zip(alive, self._probe_all(alive)):
                if reason and backend.healthy:
                    self.set_health(backend.id, False, reason)
                    report.failed_probes.append(backend.id)
                elif reason is None and not backend.healthy and not _probe_cannot_restore(backend):
                    self.set_health(backend.id, True)
                    report.recovered.append(backend.id)
        report.reaped_leases = self.reap_expired(now, reap_batch)
        report.corrected_counts = self.reconcile()
        return report

    def _probe_all(self, backends: list[Backend]) -> list[str | None]:
        """Probe in parallel: one slow or dead backend must not stall the pass for a thousand others."""
        if not backends:
            return []
        timeout = self.settings.llm_probe_timeout_s
        with ThreadPoolExecutor(max_workers=min(32, len(backends))) as executor:
            return list(executor.map(lambda b: probe_health(b.url, timeout, self.settings.backend_token), backends))

    def reap_expired(self, now: float | None = None, batch: int = 1000) -> int:
        """Release trajectories whose lease expired (their rollout died without releasing)."""
        now = time.time() if now is None else now
        reaped = 0
        while True:
            due = self.redis.zrangebyscore(self.keys.llm_leases, "-inf", now, start=0, num=batch)
            if not due:
                return reaped
            reaped += int(self._release(keys=self._selection_keys, args=[now, *due]))
            if len(due) < batch:
                return reaped

    def reconcile(self) -> int:
        """Recount in-flight per backend from the charges; returns how many counts were wrong."""
        k = self.keys
        return int(self._reconcile(keys=[k.llm_charges, k.backend_inflight, k.backend_capacity, k.backend_load]))

    def inflight_total(self) -> int:
        return sum(int(v) for v in self.redis.hvals(self.keys.backend_inflight))
