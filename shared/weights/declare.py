"""A version a trainer declares for the servers it owns and updates itself (verl, SkyRL): nothing is loaded.

The version becomes the model's current one and the named backends' label, so every later turn they
sample records it and `max_staleness` counts from it. It is written under the model's update lock
(the one `update.py` holds), so a declaration never interleaves with a service update of the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.exceptions import LockError

from shared.backend_pool import BackendPool
from shared.errors import RolloutsError, ValidationError
from shared.weights.update import UpdateInProgress
from shared.weights.versions import Current, VersionBackwards, WeightVersions

# How long a declaration may hold the model's lock, and wait for an update's.
_LEASE_S = 30
_WAIT_S = 5


class BackendNotRegistered(RolloutsError, LookupError):
    """A backend named in a declaration is not registered (the API answers 404)."""


@dataclass(frozen=True)
class Declared:
    """The declared version's place in the model's order, and the backends now labelled with it."""

    seq: int
    backends: list[str]


def declare_version(pool: BackendPool, model: str, version: str, backend_ids: list[str], owner: str) -> Declared:
    """Make `version` the model's current one and the backends' label. Refused before anything is written:
    a backend that is not registered (BackendNotRegistered) or serves another model (ValidationError at
    `body.backends`), a version that goes backwards (at `body.version`), an update of the model running
    (UpdateInProgress)."""
    for backend_id in backend_ids:
        backend = pool.get(backend_id)
        if backend is None:
            raise BackendNotRegistered(f"body.backends: no backend {backend_id!r}")
        if backend.model != model:
            raise ValidationError(
                f"backend {backend_id!r} serves model {backend.model!r}, not {model!r}", ("body", "backends")
            )
    versions = WeightVersions(pool.redis, pool.keys)
    try:
        with pool.redis.lock(pool.keys.weight_lock(model), timeout=_LEASE_S, blocking_timeout=_WAIT_S):
            try:
                seq = versions.declare(model, version, owner)
            except VersionBackwards as exc:
                raise ValidationError(str(exc), ("body", "version")) from None
            declared = [b for b in backend_ids if pool.declare_version(b, version)]
    except LockError:
        raise UpdateInProgress(f"an update of model {model!r} is running: declare again after it") from None
    return Declared(seq, declared)


def current_version(pool: BackendPool, model: str) -> Current:
    """The model's current version as the pool's Redis holds it (no version, seq 0: never updated)."""
    return WeightVersions(pool.redis, pool.keys).current(model)
