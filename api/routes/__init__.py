"""Every router the app mounts; a new area of the API adds its router here."""

from api.routes import backends, batches, external_agent, health, jobs, metrics, run_stats, status, viewer, weights

ROUTERS = [
    health.router,
    jobs.router,
    external_agent.router,
    status.router,
    backends.router,
    batches.router,
    metrics.router,
    run_stats.router,
    viewer.router,
    weights.router,
]
