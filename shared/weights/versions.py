"""Which policy version each model serves, in order: the sequence number of every applied version.

vLLM labels tokens with free-form version strings; staleness (`max_staleness` of a batch) needs
an order. The order is the order updates were applied: the first update of a model gets
sequence 1, the next new version 2, and so on; the weights a server started with (vLLM's label
"default", or any label never applied through the service) are sequence 0. Re-applying the
current version (a retry) keeps its number; re-applying an older one is "backwards" and refused.
The number is reserved before the backends load the weights (a turn sampled the moment one
resumes already maps to it) and the version becomes current once one backend has it. Everything lives in Redis, so every API process sees one order.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from redis import Redis

from shared.backend_pool import STALE_WEIGHTS, served_weight_version
from shared.keys import Keys

# `path` of a version a trainer declared for the servers it owns and updates itself: nothing to load.
TRAINER_PATH = "trainer:"
# The `owner` label of a backend whose weights its trainer loads (never the service).
TRAINER_OWNER = "trainer"


class VersionBackwards(RuntimeError):
    """The version was applied before, and a newer one since: loading it again would go back in time."""


@dataclass(frozen=True)
class Current:
    """The last version applied to a model (seq 0 and no version: never updated through the service)."""

    version: str | None = None
    seq: int = 0
    path: str = ""
    applied_at: float = 0.0
    lora: str = ""  # the adapter's name when the version was loaded as a LoRA adapter from `path`


class WeightVersions:
    """Per-model version order in Redis."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    def current(self, model: str) -> Current:
        raw = {_text(k): _text(v) for k, v in self.redis.hgetall(self.keys.weight_current(model)).items()}
        if not raw:
            return Current()
        return Current(
            raw.get("version"),
            int(raw.get("seq") or 0),
            raw.get("path", ""),
            float(raw.get("applied_at") or 0),
            raw.get("lora", ""),
        )

    def check_forward(self, model: str, version: str) -> None:
        """Raise VersionBackwards if `version` was the model's current one before the current one."""
        seq = self.redis.hget(self.keys.weight_versions(model), version)
        current = self.current(model)
        if seq is not None and int(seq) < current.seq:
            raise VersionBackwards(
                f"version {version!r} was applied to model {model!r} as update {int(seq)}; "
                f"update {current.seq} ({current.version!r}) is newer: versions only move forward"
            )

    def reserve(self, model: str, version: str) -> int:
        """Give `version` its sequence number before any backend serves it (under the model's update lock),
        so that a turn sampled the moment a backend resumes already maps to it. Returns the number."""
        known = self.redis.hget(self.keys.weight_versions(model), version)
        current = self.current(model)
        seq = int(known) if known is not None and int(known) > current.seq else current.seq + 1
        if current.version == version:
            seq = current.seq
        self.redis.hset(self.keys.weight_versions(model), version, seq)
        return seq

    def record(self, model: str, version: str, path: str, lora: str = "") -> int:
        """Make `version` the model's current one (after at least one backend took it); returns its number.
        What it was loaded from (`path`, `lora`) is kept so that a restarted backend can load it again."""
        seq = self.reserve(model, version)
        self.redis.hset(
            self.keys.weight_current(model),
            mapping={"version": version, "seq": seq, "path": path, "lora": lora, "applied_at": time.time()},
        )
        return seq

    def declare(self, model: str, version: str, owner: str) -> int:
        """Make `version` current without loading anything: `owner` (a trainer run) updated its own servers.
        VersionBackwards for a version applied before a newer one; returns its number."""
        self.check_forward(model, version)
        return self.record(model, version, f"{TRAINER_PATH}{owner}")

    def seqs(self, model: str, versions: Iterable[str | None]) -> list[int]:
        """Sequence number of each version; 0 for the start-up weights and any label never applied."""
        names = list(versions)
        if not names:
            return []
        raw = self.redis.hmget(self.keys.weight_versions(model), [v or "" for v in names])
        return [int(r) if r is not None else 0 for r in raw]


def stale_reason(versions: WeightVersions, model: str, url: str, timeout_s: float, key: str | None = None) -> str:
    """Why a server registering for `model` must not be routed to yet: it reports (vLLM's GET /weight_info) a
    version other than the model's current one, e.g. restarted on the base weights after updates. "" when it
    matches, when the model was never updated, when its versions are declared by a trainer, or when the server does not say (not a vLLM, no dev routes)."""
    current_weights = versions.current(model)
    current = current_weights.version
    if current is None or current_weights.path.startswith(TRAINER_PATH):
        return ""  # a trainer updates its own servers: the service has nothing to load into this one
    served = served_weight_version(url, timeout_s, key)
    if served is None or served == current:
        return ""
    return f"{STALE_WEIGHTS}: it serves version {served!r}, the model's current one is {current!r}"


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value
