"""The LLM backend pool: least-loaded sticky routing over Redis, one Lua script per atomic step."""

from shared.backend_pool.pool import (
    NOT_SERVING_MODEL,
    STALE_WEIGHTS,
    Backend,
    BackendPool,
    MaintenanceReport,
    NoBackendAvailable,
    NotAModelServer,
    Pin,
    backend_auth,
    backend_id_for,
    check_serves_model,
    probe_health,
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
    "backend_auth",
    "backend_id_for",
    "check_serves_model",
    "probe_health",
]
