"""Apply one checkpoint to every registered backend of a model, under a Redis lock, and say what happened.

The order: refuse a second concurrent update (409), a version that goes backwards and a
checkpoint that is missing, unreadable or does not fit the served model (422: nothing changed,
serving goes on); then every backend of the model at once. A backend that fails serves weights
the model no longer has (or, after a failed reload, none it can use: see checkpoint.py): it
leaves the pool, unhealthy with a reason the pool's health probes do not undo, so no job runs
on stale weights in silence; the next update that succeeds on it brings it back.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from shared.backend_pool import STALE_WEIGHTS, Backend, BackendPool
from shared.errors import RolloutsError, ValidationError
from shared.weights.checkpoint import check_checkpoint, check_payload
from shared.weights.versions import VersionBackwards, WeightVersions
from shared.weights.vllm_routes import Checkpoint, StepFailed, StepTimes, apply

_STEPS = 5  # pause, reload, reset, set version, resume: the lock's lease covers them all


class UpdateInProgress(RolloutsError, RuntimeError):
    """Another update of the same model holds the lock (the API answers 409; retry once it ends)."""


class NoBackendsForModel(RolloutsError, LookupError):
    """No backend of the model is registered (the API answers 404)."""


@dataclass
class BackendOutcome:
    """One backend's part: what each step took, and what became of the backend."""

    id: str
    url: str
    status: str = "failed"  # updated | failed
    seconds: dict[str, float] = field(default_factory=dict)
    error: str = ""
    removed_from_pool: bool = False


@dataclass
class UpdateReport:
    """What one update did: the version's sequence number (0 when no backend took it) and every backend's part."""

    model: str
    version: str
    seq: int
    backends: list[BackendOutcome]
    seconds: float


def update_model(pool: BackendPool, model: str, checkpoint: Checkpoint) -> UpdateReport:
    """Load `checkpoint` into every backend registered for `model`; see the module docstring for the order."""
    lease = pool.settings.weights_step_timeout_s * _STEPS + 60
    lock = pool.redis.lock(pool.keys.weight_lock(model), timeout=lease, blocking=False)
    if not lock.acquire():
        raise UpdateInProgress(f"another weight update of model {model!r} is running; retry once it has finished")
    try:
        return _update_locked(pool, model, checkpoint)
    finally:
        lock.release()


def _update_locked(pool: BackendPool, model: str, checkpoint: Checkpoint) -> UpdateReport:
    started = time.perf_counter()
    versions = WeightVersions(pool.redis, pool.keys)
    try:
        versions.check_forward(model, checkpoint.version)
    except VersionBackwards as exc:
        raise ValidationError(str(exc), ("body", "version")) from None
    backends = [b for b in pool.backends() if b.model == model]
    if not backends:
        raise NoBackendsForModel(f"no backend serving model {model!r} is registered")
    reference = next((b.tokenizer for b in backends if b.tokenizer), None)
    if checkpoint.data is not None:
        check_payload(checkpoint.data, reference)
    else:
        if pool.settings.backend_admin_token and not pool.settings.checkpoint_roots:
            # Behind node gateways, which refuse every path then: refused here, before a backend is paused.
            raise ValidationError(
                "the backends are behind node gateways and ROLLOUTS_CHECKPOINT_ROOTS is empty, so "
                "no path can be reloaded: set it to the directories trainers save under",
                ("body", "path"),
            )
        check_checkpoint(
            checkpoint.path, reference, lora=checkpoint.lora is not None, roots=pool.settings.checkpoint_roots
        )
    versions.reserve(model, checkpoint.version)
    timeout = pool.settings.weights_step_timeout_s
    with ThreadPoolExecutor(max_workers=min(16, len(backends))) as executor:
        outcomes = list(executor.map(lambda b: _apply_one(pool, b, checkpoint, timeout), backends))
    updated = any(o.status == "updated" for o in outcomes)
    seq = versions.record(model, checkpoint.version, checkpoint.path, checkpoint.lora or "") if updated else 0
    return UpdateReport(model, checkpoint.version, seq, outcomes, time.perf_counter() - started)


def _apply_one(pool: BackendPool, backend: Backend, checkpoint: Checkpoint, timeout: float) -> BackendOutcome:
    """Update one backend; one that fails leaves the pool with the reason."""
    outcome = BackendOutcome(backend.id, backend.url)
    times = StepTimes()
    try:
        apply(backend.url, checkpoint, timeout, times, pool.settings.backend_admin_token)
    except StepFailed as exc:
        outcome.error, outcome.seconds = str(exc), times.seconds
        outcome.removed_from_pool = pool.set_health(
            backend.id, False, f"{STALE_WEIGHTS}: update to {checkpoint.version!r} failed at {exc}"
        )
        return outcome
    outcome.status, outcome.seconds = "updated", times.seconds
    if backend.unhealthy_reason.startswith(STALE_WEIGHTS):
        pool.set_health(backend.id, True)  # it missed an earlier update; now it has the current weights
    return outcome


def catch_up(pool: BackendPool, backend_id: str) -> BackendOutcome | None:
    """Bring a backend that registered behind its model's current weights (a vLLM restarted on the base
    weights, on a Slurm node or by hand) up to them, so the pool routes to it again; None when there is
    nothing to do. It waits for an update of the model in progress (that may move the current version on),
    and leaves the backend out, with the reason, when the current weights cannot be loaded: bytes are not
    kept by the service, and a checkpoint may be gone."""
    lease = pool.settings.weights_step_timeout_s * _STEPS + 60
    backend = pool.get(backend_id)
    if backend is None or not backend.unhealthy_reason.startswith(STALE_WEIGHTS):
        return None
    with pool.redis.lock(pool.keys.weight_lock(backend.model), timeout=lease, blocking_timeout=lease):
        backend = pool.get(backend_id)  # as the update that held the lock left it
        if backend is None or not backend.unhealthy_reason.startswith(STALE_WEIGHTS):
            return None
        current = WeightVersions(pool.redis, pool.keys).current(backend.model)
        if current.version is None:
            return None
        if current.path.startswith("upload:"):
            pool.set_health(
                backend.id,
                False,
                f"{STALE_WEIGHTS}: the model's current weights {current.version!r} "
                "were sent as bytes, which the service does not keep: send them again (PUT)",
            )
            return None
        checkpoint = Checkpoint(current.path, current.version, lora=current.lora or None)
        return _apply_one(pool, backend, checkpoint, pool.settings.weights_step_timeout_s)
