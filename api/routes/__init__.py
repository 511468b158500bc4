"""Every router the app mounts; a new area of the API adds its router here."""

from api.routes import agent, backends, batches, health, jobs, metrics, status, viewer, weights

ROUTERS = [
    health.router,
    jobs.router,
    agent.router,
    status.router,
    backends.router,
    batches.router,
    metrics.router,
    viewer.router,
    weights.router,
]
