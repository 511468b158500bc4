"""The LLM backend pool: least-loaded sticky routing over Redis, one Lua script per atomic step; the
servers' own answers about themselves (`probe.py`)."""

from shared.backend_pool.pool import (
    NOT_SERVING_MODEL,
    STALE_WEIGHTS,
    Backend,
    BackendPool,
    MaintenanceReport,
    NoBackendAvailable,
    NotAModelServer,
    Pin,
    backend_id_for,
    check_serves_model,
)
from shared.backend_pool.probe import (
    ProbeError,
    backend_auth,
    probe_health,
    served_models,
    served_weight_version,
)

__all__ = [
    "NOT_SERVING_MODEL",
    "STALE_WEIGHTS",
    "Backend",
    "BackendPool",
    "MaintenanceReport",
    "NoBackendAvailable",
    "NotAModelServer",
    "Pin",
    "ProbeError",
    "backend_auth",
    "backend_id_for",
    "check_serves_model",
    "probe_health",
    "served_models",
    "served_weight_version",
]
